package attach

import (
	"fmt"

	"github.com/cilium/ebpf/link"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// socketRead hops see a socket's reads, scoped by the reader's netns
// (hop_sock_read reads current's); the program's own section names its event
// (consume_skb for UDP, skb_copy_datagram_iovec for TCP).
var socketRead = hopKind{prepare: prepareSocketRead, attach: attachSocketRead}

func prepareSocketRead(p *pending) error {
	if p.plan.GetDev() != "" {
		return fmt.Errorf("socket-read takes no dev (got %q): it is scoped by the reader's netns", p.plan.GetDev())
	}
	if err := socketReadProgram(&p.cfg); err != nil {
		return err
	}
	if err := p.netnsInode(); err != nil {
		return err
	}
	p.describe = fmt.Sprintf("socket-read (%s) in netns %s", p.cfg.Program, p.nsName)
	return nil
}

// attachSocketRead attaches the enqueue side (a UDP hop's companion) first:
// a read must find the IDs of what was queued.
func attachSocketRead(p *pending, l *loader.Hop) (detachers, error) {
	var enqueue link.Link
	if l.Companion != nil {
		var err error
		if enqueue, err = link.AttachTracing(link.TracingOptions{Program: l.Companion}); err != nil {
			return nil, fmt.Errorf("%s: %w", p.cfg.Companion, err)
		}
	}
	read, err := link.AttachTracing(link.TracingOptions{Program: l.Program})
	if err != nil {
		if enqueue != nil {
			_ = enqueue.Close()
		}
		return nil, err
	}
	if enqueue == nil {
		return detachers{read}, nil
	}
	return detachers{read, enqueue}, nil
}

// socketReadProgram checks a socket-read hop's program and, for UDP, picks
// how this kernel lets it see the read: where the receive path frees the
// datagram after the read on another CPU (skb_attempt_defer_free, 6.18) no
// event has the skb at the read, so kernels with sock:sk_data_ready and
// sock:sock_recv_length pair the two (hop_sock_read_udp_queue); older ones
// (5.10 up) see the free in recvmsg itself (skb:consume_skb, hop_sock_read_udp).
func socketReadProgram(cfg *loader.HopConfig) error {
	switch cfg.Program {
	case loader.ProgSockReadTCP:
		return nil
	case loader.ProgSockReadUDP:
		if loader.HasTracepoint("sk_data_ready") && loader.HasTracepoint("sock_recv_length") {
			cfg.Program = loader.ProgSockReadUDPQueue
			cfg.Companion = loader.ProgSockReadUDPEnqueue
			return nil
		}
		// skb:consume_skb has the datagram and not its socket (a queued UDP skb has no skb->sk).
		for _, f := range []record.ActionField{record.FieldRmem, record.FieldBacklog} {
			if cfg.Actions.Reads(f) {
				return fmt.Errorf("field %s at a UDP socket-read hop needs the socket at the read: "+
					"sock:sk_data_ready and sock:sock_recv_length (Linux 6.6+); this kernel has not both",
					record.FieldKeys[f])
			}
		}
		return nil
	}
	return fmt.Errorf("socket-read runs %s or %s, not %q", loader.ProgSockReadUDP, loader.ProgSockReadTCP, cfg.Program)
}
