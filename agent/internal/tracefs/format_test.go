package tracefs

import (
	"bufio"
	"strings"
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// A format file as the kernel writes it (net:net_dev_xmit on 6.18), plus an
// array and an odd-sized field.
const xmitFormat = `name: net_dev_xmit
ID: 1530
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:void * skbaddr;	offset:8;	size:8;	signed:0;
	field:unsigned int len;	offset:16;	size:4;	signed:0;
	field:int rc;	offset:20;	size:4;	signed:1;
	field:__data_loc char[] name;	offset:24;	size:4;	signed:0;
	field:u8 saddr[4];	offset:28;	size:4;	signed:0;
	field:char odd;	offset:32;	size:3;	signed:1;
	field:char comm[16];	offset:36;	size:16;	signed:0;

print fmt: "dev=%s skbaddr=%p len=%u rc=%d", __get_str(name), REC->skbaddr, REC->len, REC->rc
`

func TestParseFormat(t *testing.T) {
	f, err := ParseFormat(bufio.NewScanner(strings.NewReader(xmitFormat)))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Names(); got != "comm, len, name, odd, rc, saddr, skbaddr" {
		t.Fatalf("arguments %q (common_* must be left out)", got)
	}
	for _, want := range []Arg{
		{Name: "skbaddr", Type: "void *", Offset: 8, Size: 8},
		{Name: "len", Type: "unsigned int", Offset: 16, Size: 4},
		{Name: "rc", Type: "int", Offset: 20, Size: 4, Signed: true},
	} {
		got, ok := f.Arg(want.Name)
		if !ok || got != want {
			t.Errorf("%s: %+v, want %+v", want.Name, got, want)
		}
	}
	for name, words := range map[string]string{"name": "a string", "comm": "a string", "saddr": "an array", "odd": "3 bytes wide"} {
		a, _ := f.Arg(name)
		if a.Size != 0 || !strings.Contains(a.Unsupported, words) {
			t.Errorf("%s: %+v, want unsupported (%s)", name, a, words)
		}
	}
	// Strings compare with a text: where the record keeps each; a u8 array is no string.
	for name, want := range map[string][2]int{"name": {record.EventTextDataLoc, 0}, "comm": {record.EventTextArray, 15}, "saddr": {0, 0}} {
		if a, _ := f.Arg(name); int(a.Text) != want[0] || a.TextCap != want[1] {
			t.Errorf("%s: text kind %d cap %d, want %v", name, a.Text, a.TextCap, want)
		}
	}
}

func TestReadFormatOfThisKernel(t *testing.T) {
	f, err := ReadFormat("irq", "softirq_entry")
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := f.Arg("vec"); !ok || a.Offset != 8 || a.Size != 4 || a.Signed {
		t.Fatalf("vec = %+v (%v), want offset 8, 4 bytes, unsigned", a, ok)
	}
	if _, err := ReadFormat("irq", "no_such_event"); err == nil || !strings.Contains(err.Error(), "no such tracepoint") {
		t.Fatalf("err %v", err)
	}
	if _, err := ReadFormat("../irq", "x"); err == nil {
		t.Fatal("a path in a tracepoint name was accepted")
	}
}
