package loadgen

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
