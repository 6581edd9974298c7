package tracer

import (
	"github.com/hoptrace/hoptrace/agent/internal/attach"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// Check looks at every attached hop of the running traces: a hop whose
// netns or device went away (attach.Survey.Gone: one visit of each netns
// for all of them) is detached and released, and its status says why
// ("hop a-veth-in: device veth-c1 is gone from netns c1"). It returns the status of each trace that changed, for the session
// to report; a trace with nothing attached any more is no longer active.
// Hops are not attached again when a device of the same name comes back:
// the program would be on another device than the plan was checked against;
// applying the trace again attaches it.
func (m *Manager) Check() []*pb.TraceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	var changed []*pb.TraceStatus
	survey := attach.NewSurvey()
	for _, t := range m.traces {
		kept := t.Hops[:0]
		lost := false
		for _, h := range t.Hops {
			why := survey.Gone(h)
			if why == "" {
				kept = append(kept, h)
				continue
			}
			h.Close()
			lost = true
			for _, hs := range t.Status.Hops {
				if hs.GetHopIndex() == h.Index {
					hs.Attached = false
					hs.Error = "hop " + h.Name + ": " + why
				}
			}
		}
		t.Hops = kept
		if !lost {
			continue
		}
		if len(t.Hops) == 0 && len(t.Events) == 0 && t.Tagger == nil {
			t.Status.Active = false
		}
		m.commit(t) // a restarted agent takes over what is left, with this status
		changed = append(changed, cloneStatus(t.Status))
	}
	return changed
}
