// Command switchyard runs a Switchyard node, a demo worker, a client that
// streams a job, or a load benchmark.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Version is stamped by the Makefile.
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "switchyard:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: switchyard <command> [flags]

commands:
  node     run a node (HTTP API, worker gRPC API, embedded catalog)
  worker   run a worker; --demo tokens streams the input's words back
  demo     run a node and a demo tokens worker in one process (make run)
  submit   post a job and stream its events to stdout
  bench    drive jobs through a node and print latency and throughput
  health   exit 0 if a node answers /readyz (container health checks)
  members  list, add or remove the catalog's etcd members (docs/membership.md)
  version  print the version

Run 'switchyard <command> -h' for its flags. Every flag can also be set as
SWITCHYARD_<FLAG> in the environment (dashes become underscores).
`

// commands are the subcommands that take flags, by name.
var commands = map[string]func(ctx context.Context, args []string) error{
	"node":    runNode,
	"worker":  runWorker,
	"demo":    runDemo,
	"submit":  runSubmit,
	"bench":   runBench,
	"health":  runHealth,
	"members": runMembers,
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return flag.ErrHelp
	}
	if cmd, ok := commands[args[0]]; ok {
		return cmd(ctx, args[1:])
	}
	switch args[0] {
	case "version":
		fmt.Println(Version)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
