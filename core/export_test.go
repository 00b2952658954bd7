package core

// AffinityOrder is a key's order of consumers (ids, with their slots),
// best first: affinity.go's rendezvous order, for black-box tests and the
// benchmark's "keys moved" figure.
func AffinityOrder(key string, slots map[string]int) []string {
	cands := make([]*consumerSlot, 0, len(slots))
	for id, n := range slots {
		cands = append(cands, &consumerSlot{id: id, slots: n})
	}
	var out []string
	for _, c := range affinityOrder(keyHash(key), cands) {
		out = append(out, c.id)
	}
	return out
}
