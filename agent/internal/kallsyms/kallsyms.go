// Package kallsyms names kernel addresses by the function that holds them, from /proc/kallsyms: the
// address skb:kfree_skb gives as where a packet was freed (a drops: true hop's drop_function field)
// becomes the name a user reads ("nft_do_chain"), never the address, which KASLR randomizes per boot.
//
// The table is read on the first address to name (again, at most every 30 s, for an address it
// lacks: a module loaded since), and each address's name is kept: a node frees its dropped packets
// at a few places. A node whose kallsyms the agent cannot read (no file,
// or every address 0: kptr_restrict, or no CAP_SYSLOG) names every address Unknown.
package kallsyms

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Unknown names an address no function of the table holds, and every address where the table
// cannot be read.
const Unknown = "unknown"

// maxFunction is how far past a symbol's start an address may be and still be in it: kallsyms
// has no sizes, and the symbol before an address outside every function (past _etext, in a gap
// between module areas) is not where it is. The kernel's longest functions are tens of KiB.
const maxFunction = 1 << 17

// maxNamed bounds the addresses a Namer keeps the name of.
const maxNamed = 4096

// FunctionID is the ID that stands for a function's name in a record's values (FNV-1a 64 of the
// name; RecordBatch.functions names it), never 0: 0 is a function the agent could not name.
func FunctionID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// Table is the kernel's text symbols by address: starts sorted, the name of starts[i] is
// names[offs[i]:offs[i+1]] (one string, not 60 000: the table of a 6.18 kernel is about 2 MB so).
type Table struct {
	starts []uint64
	offs   []uint32
	names  string
}

// Parse reads /proc/kallsyms' lines ("ADDRESS TYPE NAME [MODULE]"): the text symbols (types t, T,
// w, W), without the __pfx_ padding before each function (CONFIG_FUNCTION_PADDING_CFI) and with
// the compiler's suffixes cut (ip_rcv_finish_core.constprop.0 and a function's .cold part are
// ip_rcv_finish_core, as the kernel's source names it). An error for a line that is no kallsyms
// line; a table of no symbols when every address is 0 (addresses hidden from this reader).
func Parse(r io.Reader) (*Table, error) {
	type symbol struct {
		start uint64
		name  string
	}
	var syms []symbol
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) < 3 || len(f[1]) != 1 {
			return nil, fmt.Errorf("kallsyms line %d: %q", line, sc.Text())
		}
		start, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("kallsyms line %d: address %q", line, f[0])
		}
		switch f[1] {
		case "t", "T", "w", "W":
		default:
			continue
		}
		if start == 0 || strings.HasPrefix(f[2], "__pfx_") {
			continue
		}
		name, _, _ := strings.Cut(f[2], ".")
		syms = append(syms, symbol{start, name})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kallsyms: %w", err)
	}
	sort.SliceStable(syms, func(i, j int) bool { return syms[i].start < syms[j].start })
	t := &Table{starts: make([]uint64, 0, len(syms)), offs: make([]uint32, 0, len(syms)+1)}
	var names strings.Builder
	for _, s := range syms {
		t.starts = append(t.starts, s.start)
		t.offs = append(t.offs, uint32(names.Len()))
		names.WriteString(s.name)
	}
	t.offs = append(t.offs, uint32(names.Len()))
	t.names = names.String()
	return t, nil
}

// Len is the number of symbols in the table.
func (t *Table) Len() int { return len(t.starts) }

// Function is the name of the function holding addr, "" when none does.
func (t *Table) Function(addr uint64) string {
	i := sort.Search(len(t.starts), func(i int) bool { return t.starts[i] > addr }) - 1
	if i < 0 || addr-t.starts[i] >= maxFunction {
		return ""
	}
	return t.names[t.offs[i]:t.offs[i+1]]
}

// Function is a named kernel function: its ID in records' values and its name.
type Function struct {
	ID   uint64 // FunctionID(Name); 0 for Unknown
	Name string
}

// Namer names addresses from one kallsyms file, read on first use; safe for concurrent use. An
// address no function of the table holds is looked up again in a table read anew, once the table is
// rereadAfter old: a module loaded since (nf_tables, where it is one) has its functions there.
type Namer struct {
	path string

	mu     sync.Mutex
	table  *Table
	err    error
	read   time.Time // when the table was read last; zero: never
	warned bool
	named  map[uint64]Function
}

// rereadAfter is how old the table must be before an address it lacks has it read again.
const rereadAfter = 30 * time.Second

// NewNamer names addresses from the kallsyms file at path.
func NewNamer(path string) *Namer { return &Namer{path: path, named: map[uint64]Function{}} }

// Kernel names addresses of the running kernel (/proc/kallsyms).
var Kernel = NewNamer("/proc/kallsyms")

// readLocked reads the table; a table read before stays when this read fails.
func (n *Namer) readLocked() {
	n.read = time.Now()
	f, err := os.Open(n.path)
	var table *Table
	if err == nil {
		table, err = Parse(f)
		f.Close()
	}
	if err == nil && table.Len() == 0 {
		err = fmt.Errorf("%s: every address is 0 (kernel.kptr_restrict, or a reader without CAP_SYSLOG)", n.path)
	}
	if err == nil {
		n.table, n.err = table, nil
		return
	}
	if n.table == nil {
		n.err = err
	}
	if !n.warned {
		n.warned = true
		slog.Warn("kernel functions unnamed: drops name where packets were freed "+Unknown, "err", err)
	}
}

// Err says why the namer names every address Unknown (nil when it can name them); it reads the
// table when nothing did yet.
func (n *Namer) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.read.IsZero() {
		n.readLocked()
	}
	return n.err
}

func (n *Namer) nameLocked(addr uint64) string {
	if n.table == nil {
		return ""
	}
	return n.table.Function(addr)
}

// Function names the function holding the kernel address addr: its ID 0 and Unknown when no
// function of the table holds it, or the table cannot be read.
func (n *Namer) Function(addr uint64) Function {
	n.mu.Lock()
	defer n.mu.Unlock()
	stale := !n.read.IsZero() && time.Since(n.read) >= rereadAfter
	if f, ok := n.named[addr]; ok && (f.ID != 0 || !stale) {
		return f
	}
	if n.read.IsZero() {
		n.readLocked()
	}
	name := n.nameLocked(addr)
	if name == "" && stale {
		n.readLocked()
		name = n.nameLocked(addr)
	}
	f := Function{Name: Unknown}
	if name != "" {
		f = Function{ID: FunctionID(name), Name: name}
	}
	// Distinct addresses are the places of a kernel that free packets with a reason: a few
	// hundred, each kept once (and no more than maxNamed, whatever comes).
	if _, ok := n.named[addr]; ok || len(n.named) < maxNamed {
		n.named[addr] = f
	}
	return f
}
