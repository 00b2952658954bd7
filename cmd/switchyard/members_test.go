package main

import (
	"context"
	"strings"
	"testing"
)

// The flags `members add` prints paste into a POSIX shell as they are.
func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"--name", "d", "--initial-cluster", "a=https://10.0.0.1:2380,d=https://[::1]:2380", "it's", ""})
	want := `--name d --initial-cluster 'a=https://10.0.0.1:2380,d=https://[::1]:2380' 'it'\''s' ''`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}

func TestMembersRefusesUnknownCommand(t *testing.T) {
	err := runMembers(context.Background(), []string{"promote"})
	if err == nil || !strings.Contains(err.Error(), `unknown members command "promote"`) {
		t.Errorf("members promote: %v", err)
	}
}
