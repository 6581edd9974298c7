package preset

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
)

func TestRunRefusesUnknownPresetAndArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args map[string]string
		want string
	}{
		{"nope", nil, `unknown preset "nope"`},
		{"mace", map[string]string{"container": "c1", "colour": "red"}, `unknown argument "colour"`},
		{"iron", map[string]string{"duration": "soon"}, "argument duration"},
		{"mace", map[string]string{"container": "c1", "duration": "0s"}, "duration: must be > 0"},
		// Review findings 1 and 8: a remote run chose the object to load and where a root agent sends data.
		{"mace", map[string]string{"container": "c1", "object": "/tmp/evil.o"}, "argument object is for local runs only"},
		{"iron", map[string]string{"influx-url": "http://198.18.0.9/"}, "argument influx-url is for local runs only"},
	} {
		_, err := Run(context.Background(), tc.name, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%s, %v) = %v, want an error with %q", tc.name, tc.args, err, tc.want)
		}
	}
}

func TestSummaryOfFoldsIronLines(t *testing.T) {
	out := `{"type":"ready"}
{"type":"task","tgid":1,"comm":"init"}
{"type":"container","container":"c1","caused_ns":5}
{"type":"summary","node":"n","containers":1,"tasks":1}
`
	s, err := summaryOf([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Node         string           `json:"node"`
		PerContainer []map[string]any `json:"per_container"`
		PerTask      []map[string]any `json:"per_task"`
	}
	if err := json.Unmarshal([]byte(s), &got); err != nil {
		t.Fatal(err)
	}
	if got.Node != "n" || len(got.PerContainer) != 1 || got.PerContainer[0]["container"] != "c1" || len(got.PerTask) != 1 {
		t.Fatalf("summary %s", s)
	}
	if _, err := summaryOf([]byte(`{"type":"ready"}` + "\n")); err == nil {
		t.Fatal("no summary accepted")
	}
	m, err := summaryOf([]byte(`{"type":"echo"}` + "\n" + `{"type":"summary","path":"inner-dev"}` + "\n"))
	if err != nil || strings.Contains(m, "per_container") {
		t.Fatalf("mace summary %s, %v", m, err)
	}
}

// A local run given another object than the preset's own is refused before anything loads.
func TestPresetLoadsOnlyAnObjectOfItsKind(t *testing.T) {
	hops := filepath.Join("..", "..", "..", "kernel-patch", "build", "hoptrace.bpf.o")
	err := RunIron(context.Background(), IronConfig{Object: hops, Duration: time.Second}, io.Discard)
	if !errors.Is(err, allowlist.ErrNotAllowed) {
		t.Fatalf("iron with the hop programs' object: %v, want a refusal", err)
	}
}
