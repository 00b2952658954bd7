package core

// KeyHash is keyHash, for its test against hash/fnv.
var KeyHash = keyHash

// CapabilityStrings is capabilityStrings, for its test against
// Capabilities.Strings.
var CapabilityStrings = capabilityStrings
