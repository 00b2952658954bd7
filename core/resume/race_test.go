//go:build race

package resume_test

// raceDetector is true when the tests run with -race, which allocates
// where a plain build does not: allocation counts are checked without it.
const raceDetector = true
