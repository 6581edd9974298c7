package metrics

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestTextFormat(t *testing.T) {
	r := &Registry{}
	r.Counter("x_total", "Things.\nTwo lines.", func() float64 { return 3 })
	r.Gauge("y_ratio", "A ratio.", func() float64 { return 0.25 })
	r.CounterVec("z_total", "By reason.", func() []Sample {
		return []Sample{{Labels: []string{"reason", `b"q\`}, Value: 2}, {Labels: []string{"reason", "a", "k", "v"}, Value: 1e21}}
	})
	var sb strings.Builder
	if err := r.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	want := `# HELP x_total Things.\nTwo lines.
# TYPE x_total counter
x_total 3
# HELP y_ratio A ratio.
# TYPE y_ratio gauge
y_ratio 0.25
# HELP z_total By reason.
# TYPE z_total counter
z_total{reason="a",k="v"} 1e+21
z_total{reason="b\"q\\"} 2
`
	if sb.String() != want {
		t.Errorf("got\n%s\nwant\n%s", sb.String(), want)
	}
}

func TestServeMetricsAndHealth(t *testing.T) {
	defer goleak.VerifyNone(t)
	r := &Registry{}
	r.Gauge("up", "Up.", func() float64 { return 1 })
	lis, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Serve(ctx, lis, Handler(r, nil), nil); close(done) }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + lis.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "\nup 1\n") {
		t.Errorf("/metrics %d %q", code, body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz %d %q", code, body)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	<-done
	if _, err := Listen("127.0.0.1:99999"); err == nil || !strings.Contains(err.Error(), "metrics listen 127.0.0.1:99999") {
		t.Errorf("bad address: %v", err)
	}
}
