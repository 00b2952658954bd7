package core

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Capabilities is a set of key=value pairs a worker can run, for example
// model=demo. A worker may declare several values for one key (model=a and
// model=b); a job requires one value per key.
type Capabilities map[string][]string

// ParseCapabilities parses "key=value" strings.
func ParseCapabilities(pairs []string) (Capabilities, error) {
	c := Capabilities{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || !validCapabilityPart(k) || !validCapabilityPart(v) {
			return nil, fmt.Errorf("capability %q: want key=value of [A-Za-z0-9._:/-]", p)
		}
		if !slices.Contains(c[k], v) {
			c[k] = append(c[k], v)
		}
	}
	return c, nil
}

// Strings returns the capabilities as sorted "key=value" strings.
func (c Capabilities) Strings() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		for _, v := range c[k] {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return out
}

// Satisfies reports whether c has every key=value that req requires.
func (c Capabilities) Satisfies(req map[string]string) bool {
	for k, v := range req {
		if !slices.Contains(c[k], v) {
			return false
		}
	}
	return true
}

func validCapabilityPart(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '.', r == '_', r == '-', r == ':', r == '/':
		default:
			return false
		}
	}
	return true
}
