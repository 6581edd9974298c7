package preset

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
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
