package core

// KeyHash is keyHash, for its test against hash/fnv.
var KeyHash = keyHash
