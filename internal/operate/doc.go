// Package operate holds what the operator surface (outbox/operator) and the
// command line (cmd/mcp-outbox's outbox command) share: the actions on
// effects and unknown calls with their validation, so that the API, the
// page and the command line accept and refuse exactly the same things, and
// the tables the command line prints. It is internal so that none of it is
// part of the library's API.
package operate
