//go:build race

package integration_test

// raceDetector is true when the tests run with -race: the tests whose
// size is their subject run a smaller size then, and say so.
const raceDetector = true
