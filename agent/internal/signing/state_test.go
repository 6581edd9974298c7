package signing

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// stateDirs are where a state file may be: a plain directory (--command-state)
// and a bpffs (--pin-dir), each its own.
func stateDirs(t *testing.T) map[string]string {
	t.Helper()
	dirs := map[string]string{"file": t.TempDir()}
	if os.Geteuid() != 0 {
		t.Log("not root: no bpffs of its own, the pinned state is not tested")
		return dirs
	}
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	dirs["bpffs"] = filepath.Join(bpffs, "hoptrace") // made by the first write, as --pin-dir
	return dirs
}

// TestReplayRefusedAfterRestart: a command taken by one agent, played again
// to the next agent of the node (a verifier of the same state file), is
// refused as replayed and counted; so is an older sequence, while a newer
// command passes. The state is root's
// alone (0600) and written whole: nothing of the write is left beside it.
func TestReplayRefusedAfterRestart(t *testing.T) {
	ca := newPKI(t)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	for kind, dir := range stateDirs(t) {
		t.Run(kind, func(t *testing.T) {
			now := clock
			path := StatePath(dir, "host-a.example")
			before := verifierAt(t, ca, &now)
			if err := before.Persist(path); err != nil {
				t.Fatal(err)
			}
			captured := signCommand(t, dispatcher, "host-a.example", applyCmd(100, "t", 5))
			if _, err := before.Command("host-a.example", captured); err != nil {
				t.Fatalf("a fresh command was refused: %v", err)
			}
			if _, err := before.Command("host-a.example", signCommand(t, dispatcher, "host-a.example", presetCmd(7))); err != nil {
				t.Fatalf("a fresh preset was refused: %v", err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatalf("nothing written before the command was returned: %v", err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Fatalf("state %s has mode %v, want 0600", path, st.Mode().Perm())
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("%s holds %d entries, want the state alone", dir, len(entries))
			}

			// The restart: a new verifier, nothing in memory, the same state.
			after := verifierAt(t, ca, &now)
			if err := after.Persist(path); err != nil {
				t.Fatal(err)
			}
			if seqs, gens := after.Remembered(); seqs != 2 || gens != 0 {
				t.Fatalf("the restarted verifier remembers %d sequences, %d generations; want 2, 0", seqs, gens)
			}
			_, err = after.Command("host-a.example", captured)
			wantRefused(t, err, ReasonReplayed, `replayed plan command: sequence 100 is not above 100, the last this agent took from this signer for trace "t"`)
			_, err = after.Command("host-a.example", signCommand(t, dispatcher, "host-a.example", presetCmd(6)))
			wantRefused(t, err, ReasonReplayed, "sequence 6 is not above 7")
			_, err = after.Command("host-a.example", signCommand(t, dispatcher, "host-a.example", removeCmd(99, "t", 5)))
			wantRefused(t, err, ReasonReplayed, "replayed remove command: sequence 99 is not above 100")
			if got, want := counted(after), map[string]uint64{"plan/replayed": 1, "preset/replayed": 1, "remove/replayed": 1}; !mapsEqual(got, want) {
				t.Fatalf("counted %v, want %v", got, want)
			}
			// A dispatcher started afresh numbers its generations from 1
			// again: only the sequence, which grows with its clock, counts.
			if _, err := after.Command("host-a.example", signCommand(t, dispatcher, "host-a.example", applyCmd(102, "t", 1))); err != nil {
				t.Fatalf("a new dispatcher's first generation was refused: %v", err)
			}

			// Past every command's lifetime a restarted agent forgets them.
			now = clock.Add(MaxCommandLifetime + 2*DefaultMaxClockSkew + 1)
			later := verifierAt(t, ca, &now)
			if err := later.Persist(path); err != nil {
				t.Fatal(err)
			}
			if seqs, gens := later.Remembered(); seqs != 0 || gens != 0 {
				t.Fatalf("expired entries loaded: %d sequences, %d generations", seqs, gens)
			}
		})
	}
}

// TestUnwritableStateTakesNothing: a command whose sequence cannot be kept is
// not taken (it would be taken again after a restart), and the verifier does
// not remember it either.
func TestUnwritableStateTakesNothing(t *testing.T) {
	ca := newPKI(t)
	dispatcher := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	now := clock
	v := verifierAt(t, ca, &now)
	dir := filepath.Join(t.TempDir(), "pins")
	if err := v.Persist(filepath.Join(dir, "state")); err != nil {
		t.Fatalf("a state not written yet: %v", err)
	}
	// A file where the state's directory would be made.
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := v.Command("host-a", signCommand(t, dispatcher, "host-a", applyCmd(1, "t", 1)))
	if err == nil || ReasonOf(err) != "" {
		t.Fatalf("taken without its state written: %v", err)
	}
	if seqs, gens := v.Remembered(); seqs != 0 || gens != 0 {
		t.Fatalf("remembered %d sequences, %d generations of a command not taken", seqs, gens)
	}
}

func presetCmd(seq uint64) *pb.Command {
	return fresh(seq, &pb.Command{Action: &pb.Command_RunPreset{RunPreset: &pb.RunPreset{Id: "1", Preset: "mace"}}})
}
