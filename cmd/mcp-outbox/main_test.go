package main

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/e2e"
)

// The tests here run package main's code in-process, and start the binary
// now and then; the end-to-end tests, which start processes throughout,
// are in ./e2e. Both use the harness of internal/e2e, under the names
// below.

// Binaries built once for the tests that need a real process: bin is a
// normal build, failpointBin is built with -tags failpoints.
var bin, failpointBin string

func TestMain(m *testing.M) {
	// Without tests to run (-run '^$', as make fuzz says), in a fuzz worker
	// process, or listing tests (make fuzz's -list '^Fuzz'), only fuzz
	// targets run or nothing does, and none of them starts the binary:
	// building it would spend their fuzzing time.
	flag.Parse()
	if flagValue("test.run") == "^$" || flagValue("test.fuzzworker") == "true" || flagValue("test.list") != "" {
		os.Exit(m.Run())
	}
	var cleanup func()
	var err error
	bin, failpointBin, cleanup, err = e2e.Binaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// The harness under the names these tests were written with.
type syncBuffer = e2e.SyncBuffer

const statefulVersion = e2e.StatefulVersion

var (
	serveStdio         = e2e.ServeStdio
	startHTTP          = e2e.StartHTTP
	startHTTPCommand   = e2e.StartHTTPCommand
	pollUntil          = e2e.PollUntil
	openLedgerDB       = e2e.OpenLedgerDB
	replicaDB          = e2e.ReplicaDB
	countRows          = e2e.CountRows
	chargeCall         = e2e.ChargeCall
	callMetaOf         = e2e.CallMetaOf
	resultText         = e2e.ResultText
	structuredChargeID = e2e.StructuredChargeID
	mustSucceed        = e2e.MustSucceed
	wantReplay         = e2e.WantReplay
	completedAt        = e2e.CompletedAt
	callStatus         = e2e.CallStatus
	bearerClient       = e2e.BearerClient
	connectHTTP        = e2e.ConnectHTTP
	wantTools          = e2e.WantTools
	postInitialize     = e2e.PostInitialize
	wantError          = e2e.WantError
	sha256Hex          = e2e.SHA256Hex
	paymentsDest       = e2e.PaymentsDest
	requestsFor        = e2e.RequestsFor
)
