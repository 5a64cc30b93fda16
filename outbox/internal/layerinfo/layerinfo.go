// Package layerinfo is what the operator surface (package outbox/operator)
// reads of a layer that a library user has no use for: whether a Start
// ever succeeded, for readiness, and its key ring, to open the results it
// shows. Package outbox sets [Of] in an init function; the operator
// imports outbox (for *outbox.Layer), so that init has run before it can
// call Of. Being internal to outbox/, none of it is part of outbox's API.
package layerinfo

import "github.com/mcp-outbox/mcp-outbox/outbox/seal"

// Info is a layer as the operator surface sees it.
type Info interface {
	// Started reports whether a Start of the layer ever succeeded.
	Started() bool
	// Keys is the layer's Options.Keys, nil without encryption.
	Keys() seal.KeyRing
}

// Of is the Info of a *outbox.Layer; package outbox sets it.
var Of func(layer any) Info
