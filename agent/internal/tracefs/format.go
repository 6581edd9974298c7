// Package tracefs reads what the node's kernel says about its tracepoints:
// which exist and the layout of each one's record (the format file), so an
// event probe's arguments resolve to offsets, sizes and signedness on this
// kernel, not on the dispatcher's.
package tracefs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Mounts tried in order; the first with an events/ directory wins.
var mountPoints = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

var mountMu sync.Mutex

// Root is the tracefs directory, mounted at /sys/kernel/tracing when no
// tracefs is mounted yet (idempotent: an existing mount is used as is).
func Root() (string, error) {
	mountMu.Lock()
	defer mountMu.Unlock()
	for _, m := range mountPoints {
		if st, err := os.Stat(filepath.Join(m, "events")); err == nil && st.IsDir() {
			return m, nil
		}
	}
	if err := unix.Mount("tracefs", mountPoints[0], "tracefs", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return "", fmt.Errorf("mount tracefs at %s: %w", mountPoints[0], err)
	}
	return mountPoints[0], nil
}

// Arg is one field of a tracepoint's record.
type Arg struct {
	Name   string
	Type   string // as the format file declares it, e.g. "unsigned int"
	Offset uint16
	Size   uint8
	Signed bool
	// Why the field cannot be compared or keyed as an integer ("" = it can):
	// strings (__data_loc), arrays, sizes other than 1, 2, 4, 8.
	Unsupported string
	// A string a where: term can compare with a text: where the record keeps
	// it (record.EventText*), 0 = not a string. TextCap: the characters a
	// char NAME[N] holds (N - 1), 0 = no bound of its own.
	Text    uint8
	TextCap int
}

// Format is a tracepoint's record layout.
type Format struct {
	Group, Event string
	Args         []Arg // the event's own fields, common_* left out
}

// Arg finds an argument by name.
func (f *Format) Arg(name string) (Arg, bool) {
	for _, a := range f.Args {
		if a.Name == name {
			return a, true
		}
	}
	return Arg{}, false
}

// Names lists the arguments, for errors.
func (f *Format) Names() string {
	names := make([]string, 0, len(f.Args))
	for _, a := range f.Args {
		names = append(names, a.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// ErrNoTracepoint: the kernel does not list GROUP:EVENT.
var ErrNoTracepoint = errors.New("this kernel has no such tracepoint")

// ReadFormat reads events/GROUP/EVENT/format under the tracefs root.
func ReadFormat(group, event string) (*Format, error) {
	if !validName.MatchString(group) || !validName.MatchString(event) {
		return nil, fmt.Errorf("tracepoint %s:%s: names are [A-Za-z0-9_]+", group, event)
	}
	root, err := Root()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "events", group, event, "format")
	file, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tracepoint %s:%s: %w", group, event, ErrNoTracepoint)
	}
	if err != nil {
		return nil, fmt.Errorf("tracepoint %s:%s: %w", group, event, err)
	}
	defer file.Close()
	f, err := ParseFormat(bufio.NewScanner(file))
	if err != nil {
		return nil, fmt.Errorf("tracepoint %s:%s: %s: %w", group, event, path, err)
	}
	f.Group, f.Event = group, event
	return f, nil
}

var (
	validName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	// "\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;"
	fieldLine = regexp.MustCompile(`^\s*field:(.+);\s*offset:(\d+);\s*size:(\d+);\s*signed:(\d+);`)
	// The declaration's last identifier, with an optional [N] array suffix.
	declName = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(\[[^\]]*\])?\s*$`)
)

// ParseFormat parses a format file's field lines.
func ParseFormat(sc *bufio.Scanner) (*Format, error) {
	f := &Format{}
	for sc.Scan() {
		m := fieldLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		decl := strings.TrimSpace(m[1])
		dm := declName.FindStringSubmatch(decl)
		if dm == nil {
			return nil, fmt.Errorf("cannot read field declaration %q", decl)
		}
		name := dm[1]
		if strings.HasPrefix(name, "common_") {
			continue
		}
		off, err1 := strconv.ParseUint(m[2], 10, 16)
		size, err2 := strconv.ParseUint(m[3], 10, 16)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("field %s: %w", name, err)
		}
		a := Arg{Name: name, Type: strings.TrimSpace(strings.TrimSuffix(decl[:len(decl)-len(dm[0])], " ")),
			Offset: uint16(off), Signed: m[4] == "1"}
		loc, isLoc := strings.CutPrefix(decl, "__data_loc ")
		rel, isRel := strings.CutPrefix(decl, "__rel_loc ")
		switch {
		case isLoc && strings.HasPrefix(loc, "char[]"):
			a.Unsupported, a.Text = "a string ("+decl+")", record.EventTextDataLoc
		case isRel && strings.HasPrefix(rel, "char[]"):
			a.Unsupported, a.Text = "a string ("+decl+")", record.EventTextRelLoc
		case isLoc || isRel:
			a.Unsupported = "a dynamic array (" + decl + ")"
		case dm[2] != "" && a.Type == "char" && size > 1:
			a.Unsupported, a.Text, a.TextCap = "a string ("+decl+")", record.EventTextArray, int(size)-1
		case dm[2] != "":
			a.Unsupported = "an array (" + decl + ")"
		case size != 1 && size != 2 && size != 4 && size != 8:
			a.Unsupported = fmt.Sprintf("%d bytes wide (1, 2, 4 or 8 can be compared)", size)
		default:
			a.Size = uint8(size)
		}
		f.Args = append(f.Args, a)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return f, nil
}
