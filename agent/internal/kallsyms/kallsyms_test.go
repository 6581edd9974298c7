package kallsyms

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A kallsyms excerpt as a 6.18 kernel prints it: padding symbols, clones with compiler suffixes, a
// .cold part, data, a module's function, and markers of where text ends.
const excerpt = `ffffffff81000000 T _stext
ffffffff81f81f80 t __pfx_nf_hook_slow
ffffffff81f81f90 T nf_hook_slow
ffffffff81f82080 t __pfx_ip_rcv_finish_core.constprop.0
ffffffff81f82090 t ip_rcv_finish_core.constprop.0
ffffffff81f82400 d some_table
ffffffff81f82800 W weak_function
ffffffff81f83000 t nf_hook_slow.cold
ffffffff82277288 T _etext
ffffffffc0a01000 t nft_do_chain	[nf_tables]
`

func TestTableNamesTheFunctionHoldingAnAddress(t *testing.T) {
	table, err := Parse(strings.NewReader(excerpt))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr uint64
		want string
	}{
		{0xffffffff81f81f90, "nf_hook_slow"},       // its first byte
		{0xffffffff81f81fd3, "nf_hook_slow"},       // a return address inside it
		{0xffffffff81f82088, "nf_hook_slow"},       // the next function's padding: no function of its own
		{0xffffffff81f820a4, "ip_rcv_finish_core"}, // a clone, named as the source does
		{0xffffffff81f82410, "ip_rcv_finish_core"}, // data symbols are no functions
		{0xffffffff81f82810, "weak_function"},      // weak text
		{0xffffffff81f83010, "nf_hook_slow"},       // the .cold part is the function's
		{0xffffffffc0a01234, "nft_do_chain"},       // a module's, without the module
		{0xffffffff82277288 + maxFunction, ""},     // far past the last text symbol
		{0xffffffff80000000, ""},                   // before the first
		{0xffffffffc0a01000 + maxFunction - 1, "nft_do_chain"},
	} {
		if got := table.Function(c.addr); got != c.want {
			t.Errorf("%#x: %q, want %q", c.addr, got, c.want)
		}
	}
	if table.Len() != 7 { // _stext, nf_hook_slow, ip_rcv_finish_core, weak_function, .cold, _etext, nft_do_chain
		t.Errorf("%d symbols, want the 7 text symbols without padding", table.Len())
	}
}

func TestParseRefusesWhatIsNoKallsyms(t *testing.T) {
	for _, text := range []string{"hello\n", "zzzz T name\n", "ffffffff81000000 TT name\n"} {
		if _, err := Parse(strings.NewReader(text)); err == nil {
			t.Errorf("%q parsed", text)
		}
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A reader kptr_restrict hides the addresses from sees every one as 0: every address is Unknown,
// with ID 0, and Err says why; a missing file likewise.
func TestHiddenAddressesNameNothing(t *testing.T) {
	var hidden []string
	for _, line := range strings.Split(strings.TrimSpace(excerpt), "\n") {
		hidden = append(hidden, "0000000000000000"+line[16:])
	}
	for name, path := range map[string]string{"hidden": writeFile(t, strings.Join(hidden, "\n")+"\n"),
		"missing": filepath.Join(t.TempDir(), "none")} {
		n := NewNamer(path)
		if f := n.Function(0xffffffff81f81fd3); f != (Function{Name: Unknown}) {
			t.Errorf("%s: %+v, want unknown with ID 0", name, f)
		}
		if n.Err() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// Each address is looked up once: a name, once given, stays the address's (the file is read once).
func TestNamerReadsOnceAndKeepsNames(t *testing.T) {
	path := writeFile(t, excerpt)
	n := NewNamer(path)
	want := Function{ID: FunctionID("nf_hook_slow"), Name: "nf_hook_slow"}
	if f := n.Function(0xffffffff81f81fd3); f != want {
		t.Fatalf("%+v, want %+v", f, want)
	}
	if err := os.WriteFile(path, []byte("ffffffff81f81f90 T other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f := n.Function(0xffffffff81f81fd3); f != want {
		t.Errorf("again: %+v", f)
	}
	if f := n.Function(0xffffffff82277288 + maxFunction); f != (Function{Name: Unknown}) {
		t.Errorf("an address of no function: %+v", f)
	}
	if FunctionID("nf_hook_slow") == FunctionID("nft_do_chain") || FunctionID("") == 0 {
		t.Error("IDs")
	}
}

// An address the table lacks is looked up in the file read anew once the table is rereadAfter old (a
// module loaded since), and a name, once given, stays.
func TestNamerReadsAgainForAModuleLoadedSince(t *testing.T) {
	path := writeFile(t, excerpt)
	n := NewNamer(path)
	const inModule = 0xffffffffc1000040
	if f := n.Function(inModule); f != (Function{Name: Unknown}) {
		t.Fatalf("before the module: %+v", f)
	}
	if err := os.WriteFile(path, []byte(excerpt+"ffffffffc1000000 t nft_do_chain_ipv4\t[nf_tables]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f := n.Function(inModule); f.ID != 0 {
		t.Fatalf("read again at once: %+v", f)
	}
	n.mu.Lock()
	n.read = n.read.Add(-rereadAfter)
	n.mu.Unlock()
	want := Function{ID: FunctionID("nft_do_chain_ipv4"), Name: "nft_do_chain_ipv4"}
	if f := n.Function(inModule); f != want {
		t.Fatalf("after %v: %+v, want %+v", rereadAfter, f, want)
	}
	// A failed read later keeps the table it had.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.read = n.read.Add(-rereadAfter)
	n.mu.Unlock()
	if f := n.Function(0xffffffff81f81fd3); f.Name != "nf_hook_slow" || n.Err() != nil {
		t.Fatalf("after a failed read: %+v (%v)", f, n.Err())
	}
}

// The running kernel's table names its own functions (as root: others see addresses as 0).
func TestKernelNamesItsFunctions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("reading kernel addresses needs root")
	}
	data, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[2] != "consume_skb" && f[2] != "netif_receive_skb") {
			continue
		}
		start, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := Kernel.Function(start + 5); got.Name != f[2] || got.ID != FunctionID(f[2]) {
			t.Errorf("%s+5: %+v", f[2], got)
		}
		found++
	}
	if found != 2 || Kernel.Err() != nil {
		t.Fatalf("%d of 2 functions in /proc/kallsyms (%v)", found, Kernel.Err())
	}
}
