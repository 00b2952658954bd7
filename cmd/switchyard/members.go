package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/switchyard/switchyard/httpapi"
)

const membersUsage = `usage: switchyard members <list|add|remove> [flags]

The members of the catalog's embedded etcd cluster, over a node's admin API
(an admin API key on a node that checks keys). docs/membership.md.

  list     the members: id, name, peer URLs, voter or learner, leader, healthy
  add      add a learner: --name and --peer-url of the new node; prints the
           flags to start it with (it joins, catches up and promotes itself)
  remove   remove a stopped node's member: --member (its name or hex id)
`

func runMembers(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, membersUsage)
		if len(args) == 0 {
			return flag.ErrHelp
		}
		return nil
	}
	cmd := args[0]
	fs := flag.NewFlagSet("members "+cmd, flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:8080", "HTTP address of any node of the cluster")
	apiKey := fs.String("api-key", "", "API key with the admin role, for a node that checks keys; better set as SWITCHYARD_API_KEY")
	tlsCA := fs.String("tls-ca", "", "PEM file of the CA that signed the node's certificate, for an https --url")
	asJSON := fs.Bool("json", false, "print the node's JSON answer")
	var name, peerURL, target *string
	switch cmd {
	case "list":
	case "add":
		name = fs.String("name", "", "the new node's id (its --name)")
		peerURL = fs.String("peer-url", "", "https://host:port: the new node's --etcd-peer-addr, as the other members reach it")
	case "remove":
		target = fs.String("member", "", "the member to remove: its name (its node's id) or its hex id; stop its node first")
	default:
		fmt.Fprint(os.Stderr, membersUsage)
		return fmt.Errorf("unknown members command %q", cmd)
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	hc, err := httpClient(*tlsCA)
	if err != nil {
		return err
	}
	call := func(method, path string, body any) ([]byte, error) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(*base, "/")+path, rd)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if *apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+*apiKey)
		}
		res, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if err != nil {
			return nil, err
		}
		if res.StatusCode/100 != 2 {
			return nil, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(b))
		}
		return b, nil
	}
	var out []byte
	switch cmd {
	case "list":
		out, err = call(http.MethodGet, "/v1/cluster/members", nil)
		if err != nil || *asJSON {
			break
		}
		var l httpapi.MemberList
		if err = json.Unmarshal(out, &l); err == nil {
			printMembers(l.Members)
		}
		return err
	case "add":
		out, err = call(http.MethodPost, "/v1/cluster/members", map[string]string{"name": *name, "peer_url": *peerURL})
		if err != nil || *asJSON {
			break
		}
		var a httpapi.MemberAdded
		if err = json.Unmarshal(out, &a); err != nil {
			return err
		}
		fmt.Printf("added learner %s (%s) at %s\n\n", a.Member.Name, a.Member.ID, strings.Join(a.Member.PeerURLs, ","))
		printMembers(a.Members)
		fmt.Printf("\nStart the new node with these flags, beside the ones every node of the cluster has\n(--cluster-secret-file, --etcd-client-addr, its HTTP, gRPC and peer addresses):\n\n  switchyard node %s\n\n", shellJoin(a.Flags))
		fmt.Println("It joins as a learner, catches up with the leader and promotes itself to a voting member.")
		return nil
	case "remove":
		out, err = call(http.MethodDelete, "/v1/cluster/members/"+url.PathEscape(*target), nil)
		if err != nil || *asJSON {
			break
		}
		var r httpapi.MemberRemoved
		if err = json.Unmarshal(out, &r); err == nil {
			fmt.Printf("removed member %s (%s) at %s\n", r.Member.Name, r.Member.ID, strings.Join(r.Member.PeerURLs, ","))
		}
		return err
	}
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(out, '\n'))
	return err
}

func printMembers(ms []httpapi.MemberResponse) {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tPEER URLS\tCLIENT URLS\tROLE\tLEADER\tHEALTHY")
	for _, m := range ms {
		role := "voter"
		if m.Learner {
			role = "learner"
		}
		name := m.Name
		if name == "" {
			name = "(not started)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%v\n", m.ID, name, strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ","), role, m.Leader, m.Healthy)
	}
	tw.Flush()
}

// shellJoin quotes each argument that needs it for a POSIX shell.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@", r))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
