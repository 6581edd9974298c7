// Package metrics serves the agent's counters in the Prometheus text
// exposition format (version 0.0.4) on /metrics, and /healthz. Values are
// read from their owners at scrape time; nothing is copied in between.
package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sample is one value of a metric with its labels (name, value pairs).
type Sample struct {
	Labels []string
	Value  float64
}

type family struct {
	name, help, typ string
	collect         func() []Sample
}

// Registry holds metric families in the order they were added.
type Registry struct {
	mu       sync.Mutex
	families []family
}

// Counter adds a counter (a value that only grows).
func (r *Registry) Counter(name, help string, f func() float64) {
	r.add(name, help, "counter", func() []Sample { return []Sample{{Value: f()}} })
}

// Gauge adds a gauge.
func (r *Registry) Gauge(name, help string, f func() float64) {
	r.add(name, help, "gauge", func() []Sample { return []Sample{{Value: f()}} })
}

// CounterVec adds a counter family with labelled samples.
func (r *Registry) CounterVec(name, help string, f func() []Sample) { r.add(name, help, "counter", f) }

// GaugeVec adds a gauge family with labelled samples.
func (r *Registry) GaugeVec(name, help string, f func() []Sample) { r.add(name, help, "gauge", f) }

func (r *Registry) add(name, help, typ string, f func() []Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.families = append(r.families, family{name, help, typ, f})
}

// WriteText writes every family in the text exposition format.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	fams := append([]family(nil), r.families...)
	r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.typ)
		samples := f.collect()
		sort.SliceStable(samples, func(i, j int) bool {
			return strings.Join(samples[i].Labels, "\x00") < strings.Join(samples[j].Labels, "\x00")
		})
		for _, s := range samples {
			bw.WriteString(f.name)
			if len(s.Labels) > 0 {
				bw.WriteByte('{')
				for i := 0; i+1 < len(s.Labels); i += 2 {
					if i > 0 {
						bw.WriteByte(',')
					}
					fmt.Fprintf(bw, "%s=\"%s\"", s.Labels[i], escapeLabel(s.Labels[i+1]))
				}
				bw.WriteByte('}')
			}
			bw.WriteByte(' ')
			bw.WriteString(formatValue(s.Value))
			bw.WriteByte('\n')
		}
	}
	return bw.Flush()
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// Handler serves /metrics from r and /healthz from health (nil = always
// healthy): 200 "ok", or 503 with the error.
func Handler(r *Registry, health func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = r.WriteText(w)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if health != nil {
			if err := health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Listen binds addr for Serve; the error names the address (a second agent
// on the same machine needs its own --metrics-listen).
func Listen(addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	return lis, nil
}

// Serve serves h on lis until ctx ends.
func Serve(ctx context.Context, lis net.Listener, h http.Handler, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Error("metrics server", "err", err)
		}
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-done
}
