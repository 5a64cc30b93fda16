// Package paramskey lifts SEP-3182's top-level params.idempotencyKey of a
// tools/call into params._meta. The go-sdk unmarshals params into
// CallToolParamsRaw, which has no such field, so the key is gone before any
// middleware runs; it has to be caught below the SDK, in the raw JSON-RPC
// message. Both fronts do it: mcpstdio on each message its connection
// reads, mcphttp on each POST body. The layer looks for the lifted key
// under [MetaKey], after _meta.idempotencyKey.
package paramskey

import (
	"encoding/json"
	"errors"
	"fmt"
)

// MetaKey is the params._meta member the fronts lift the key into and the
// layer reads it from. It is a handoff between parts of this module, not a
// name a client sends: a client sends params.idempotencyKey, or
// _meta.idempotencyKey.
const MetaKey = "io.github.mcp-outbox/paramsIdempotencyKey"

// Lift copies params.idempotencyKey into params._meta[into], and reports
// whether it did. The value is copied as it is, even when it is not a
// string, so that the layer reports a bad key instead of silently ignoring
// it. Params that are not an object, or whose _meta is not one, are
// returned unchanged, for the SDK to judge. params itself is never written
// to.
func Lift(params json.RawMessage, into string) (json.RawMessage, bool) {
	return lift(params, field{"idempotencyKey", into, true})
}

// TaskMetaKey is the params._meta member the fronts lift a tools/call's
// params.task into: the 2025-11-25 revision's request for a task
// ({"ttl": N}, or {}), which CallToolParamsRaw of the go-sdk v1.8.0 has no
// field for either. Like MetaKey it is a handoff inside this module.
const TaskMetaKey = "io.github.mcp-outbox/paramsTask"

// LiftCall lifts what a tools/call carries at the top of its params and the
// go-sdk would drop: idempotencyKey into MetaKey (even null, for the layer
// to refuse), task into TaskMetaKey (not a null one), in one pass over
// params. It reports whether it changed params.
func LiftCall(params json.RawMessage) (json.RawMessage, bool) {
	return lift(params, field{"idempotencyKey", MetaKey, true}, field{"task", TaskMetaKey, false})
}

// field is a member of params to copy into params._meta[into]; keepNull
// copies a null value too.
type field struct {
	name, into string
	keepNull   bool
}

// lift copies each of fields present in params into params._meta, and
// reports whether it copied any. Params that are not an object, or whose
// _meta is not one, are returned unchanged.
func lift(params json.RawMessage, fields ...field) (json.RawMessage, bool) {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params, false
	}
	var set map[string]json.RawMessage
	for _, f := range fields {
		v, ok := p[f.name]
		if !ok || (!f.keepNull && string(v) == "null") {
			continue
		}
		if set == nil {
			set = make(map[string]json.RawMessage, len(fields))
		}
		set[f.into] = v
	}
	if set == nil {
		return params, false
	}
	out, err := SetMeta(p, set)
	if err != nil {
		return params, false
	}
	return out, true
}

// SetMeta sets the members of set in p's _meta (a nil value deletes its
// member) and returns p encoded; p keeps the new _meta. Every other member, of p and of _meta, keeps its raw
// bytes (numbers their digits). A _meta that is absent or null counts as
// {}: "_meta": null decodes to a nil map, and a caller assigning to that
// would panic, taking the whole server down. It fails when p is nil (params
// null) or _meta is not an object.
func SetMeta(p, set map[string]json.RawMessage) (json.RawMessage, error) {
	if p == nil {
		return nil, errors.New("params: not an object")
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := p["_meta"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("_meta: %w", err)
		}
		if meta == nil {
			return nil, errors.New("_meta: not an object")
		}
	}
	for k, v := range set {
		if v == nil {
			delete(meta, k)
			continue
		}
		meta[k] = v
	}
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("_meta: %w", err)
	}
	p["_meta"] = mb
	return json.Marshal(p)
}

// FrontMetaKey is the params._meta member the fronts set on every
// initialize: it tells the layer that the session's requests come through
// a front, which lifts params.task. Over a bare go-sdk transport the
// go-sdk drops params.task, so a 2025-11-25 client that asked for a task
// would get a plain result it cannot read: the layer then offers that
// revision's Tasks to no one. A client that sends the member itself only
// fools itself, and a front overwrites it.
const FrontMetaKey = "io.github.mcp-outbox/front"

// MarkFront sets params._meta[FrontMetaKey] to true and reports whether it
// did; params that are not an object (or null), or whose _meta is not one,
// are returned unchanged.
func MarkFront(params json.RawMessage) (json.RawMessage, bool) {
	p := map[string]json.RawMessage{}
	if len(params) > 0 && string(params) != "null" {
		if json.Unmarshal(params, &p) != nil {
			return params, false
		}
	}
	out, err := SetMeta(p, map[string]json.RawMessage{FrontMetaKey: json.RawMessage("true")})
	if err != nil {
		return params, false
	}
	return out, true
}

// ListenMetaKey is the params._meta member the fronts lift a
// subscriptions/listen's notifications.taskIds into (the 2026-07-28 Tasks
// extension's filter), with the request's id: {"id": ID, "taskIds": [...]}.
// go-sdk v1.8.0 decodes the filter into NotificationSubscriptions, which
// has no taskIds, and keeps the request's id from middleware.
const ListenMetaKey = "io.github.mcp-outbox/listenTasks"

// LiftListen copies the taskIds of a subscriptions/listen's params, with
// the request's id, into params._meta[ListenMetaKey], and reports whether
// it did.
func LiftListen(id, params json.RawMessage) (json.RawMessage, bool) {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || p == nil {
		return params, false
	}
	var n map[string]json.RawMessage
	if json.Unmarshal(p["notifications"], &n) != nil {
		return params, false
	}
	ids, ok := n["taskIds"]
	if !ok || len(id) == 0 {
		return params, false
	}
	v, err := json.Marshal(map[string]json.RawMessage{"id": id, "taskIds": ids})
	if err != nil {
		return params, false
	}
	out, err := SetMeta(p, map[string]json.RawMessage{ListenMetaKey: v})
	if err != nil {
		return params, false
	}
	return out, true
}
