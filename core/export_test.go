package core

// KeyHash is keyHash, for its test against hash/fnv.
var KeyHash = keyHash

// CapabilityStrings is capabilityStrings, for its test against
// Capabilities.Strings.
var CapabilityStrings = capabilityStrings

// RaceEnabled reports whether the race detector is on (allocation counts
// differ under it).
const RaceEnabled = raceEnabled
