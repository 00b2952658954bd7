//go:build race

package core

// raceEnabled: the race detector is on, which changes what escapes, so
// allocation counts are not checked.
const raceEnabled = true
