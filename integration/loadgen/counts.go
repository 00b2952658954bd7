package loadgen

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Counts are jobs as their clients saw them: how each POST was answered
// and how each stream ended. The zero value is empty and ready.
type Counts struct {
	Submitted int
	// PostErrors got no answer, Accepted a 200; Refused counts the other
	// answers by their problem code.
	PostErrors, Accepted int
	Refused              map[string]int
	// Ended counts the streams that ended with a terminal event by how:
	// "completed" for done, an error's code otherwise. Unknown counts the
	// accepted jobs with no terminal event.
	Ended   map[string]int
	Unknown int
}

// Add counts j.
func (c *Counts) Add(j *Job) {
	if c.Refused == nil {
		c.Refused, c.Ended = map[string]int{}, map[string]int{}
	}
	c.Submitted++
	switch {
	case j.PostErr != "":
		c.PostErrors++
		return
	case j.Status != 200:
		c.Refused[j.Refusal]++
		return
	}
	c.Accepted++
	switch j.Terminal {
	case "":
		c.Unknown++
	case "done":
		c.Ended["completed"]++
	default:
		c.Ended[j.Code]++
	}
}

// ByCode is how a ledger prints a count of jobs by code (Refused, Ended,
// or a part of them): "0" for none, else the total and each code's count
// by code, as in "3: expired 1, worker_lost 2".
func ByCode(m map[string]int) string {
	total := 0
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(m)) {
		if n := m[code]; n != 0 {
			total += n
			parts = append(parts, fmt.Sprintf("%s %d", code, n))
		}
	}
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d: %s", total, strings.Join(parts, ", "))
}
