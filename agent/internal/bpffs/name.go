// Package bpffs names what the agent pins in the BPF filesystem.
package bpffs

import (
	"fmt"
	"strings"
)

// Name escapes a node or trace name for a pin: every byte but [A-Za-z0-9_-] as %XX (bpffs refuses a
// '.' in a name).
func Name(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// Unname undoes Name.
func Unname(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		var c byte
		if i+2 >= len(s) || func() bool { _, err := fmt.Sscanf(s[i+1:i+3], "%02X", &c); return err != nil }() {
			return "", fmt.Errorf("%q is no escaped name", s)
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}
