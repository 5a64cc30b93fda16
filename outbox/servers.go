package outbox

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
)

// One layer may serve many servers: one per tenant, or one per request
// (the getServer of go-sdk's StreamableHTTPHandler may build a server for
// every request). Each server has its own tools, so the registry that
// AddTool fills and the middleware reads is per server, keyed weakly: a
// server nobody uses any more is collected, and its entry goes with it.
//
// All servers of a layer share one key space: a call's key is scoped by
// principal alone, as the calls table is. That is what per-request servers
// need (a retry reaches another instance of the same server and must
// replay), and it makes a layer one idempotency domain. Tenants whose calls
// must never meet get a tenant each (ServerOptions.Tenant), which scopes
// the principal their calls are recorded under: a layer each would not
// do, since the keys live in the database the layers share.

// serverTools are the tools registered with AddTool on one server.
type serverTools struct {
	tenant string // ServerOptions.Tenant, fixed when the layer is installed
	mu     sync.Mutex
	tools  map[string]*toolInfo
}

func (r *serverTools) lookup(name string) *toolInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tools[name]
}

// anyTasks reports whether a tool of the server may become a task.
func (r *serverTools) anyTasks() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.tools {
		if t.tasks.Mode != TasksNever && t.record {
			return true
		}
	}
	return false
}

func (r *serverTools) add(t *toolInfo) {
	r.mu.Lock()
	r.tools[t.name] = t
	r.mu.Unlock()
}

// register returns s's registry, creating it if s is new to the layer; added
// says it was.
func (l *Layer) register(s *mcp.Server, tenant string) (r *serverTools, added bool) {
	key := weak.Make(s)
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.servers[key]; r != nil {
		return r, false
	}
	r = &serverTools{tenant: tenant, tools: map[string]*toolInfo{}}
	if l.servers == nil {
		l.servers = map[weak.Pointer[mcp.Server]]*serverTools{}
	}
	l.servers[key] = r
	// The cleanup and its argument reach s only weakly, so they do not
	// keep it alive; neither does anything the layer holds.
	runtime.AddCleanup(s, l.forget, key)
	return r, true
}

func (l *Layer) forget(key weak.Pointer[mcp.Server]) {
	l.mu.Lock()
	delete(l.servers, key)
	l.mu.Unlock()
}

// toolsOf returns s's registry, or nil if the layer is not installed on s.
func (l *Layer) toolsOf(s *mcp.Server) *serverTools {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.servers[weak.Make(s)]
}

// middlewareFor is the layer's receiving middleware on the server whose
// tools r holds.
func (l *Layer) middlewareFor(r *serverTools) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			creq, ok := req.(*mcp.CallToolRequest)
			switch {
			case isTaskMethod(method):
				// The SDK gives a custom method's handler no Extra, so
				// the principal (a token's user) is found here.
				ctx = context.WithValue(ctx, principalKey{}, scopedPrincipal(r.tenant, requestPrincipal(req)))
				ctx = withTaskOrigin(ctx, req.GetExtra())
				if speaks2025(req) {
					return l.tasks2025(ctx, method, req)
				}
				return next(ctx, method, req)
			case method == "server/discover":
				res, err := next(ctx, method, req)
				return advertiseTasks(r, res, err)
			case method == "subscriptions/listen":
				if lr, ok := req.(*mcp.SubscriptionsListenRequest); ok && lr.Params != nil {
					if lift, ok := takeListen(lr.Params); ok {
						return l.listenTasks(ctx, scopedPrincipal(r.tenant, requestPrincipal(req)), lr, lift)
					}
				}
				return next(ctx, method, req)
			case method == "initialize":
				res, err := next(ctx, method, req)
				if !l.fronted(ctx, r, frontMarked(req.GetParams())) {
					return res, err
				}
				return advertiseTasks2025(r, res, err)
			case method == "tools/list" && speaks2025(req) && sessionFronted(req):
				res, err := next(ctx, method, req)
				return advertiseToolTasks2025(r, res, err)
			}
			if !ok || creq.Params == nil {
				return next(ctx, method, req)
			}
			// Out of _meta for every tool: a handler never sees it.
			note := cancelnote.Take(creq.Params.Meta)
			defer note.Done()
			t := r.lookup(creq.Params.Name)
			if t == nil { // not a tool of the layer: the SDK handles it, unknown tools included
				res, err := next(ctx, method, req)
				if err == nil && creq.Params.Name != StatusToolName {
					l.warnPlainTool(creq.Params.Name)
				}
				return res, err
			}
			return l.call(ctx, t, creq, method, next, note)
		}
	}
}

// advertiseTasks lists the Tasks extension in server/discover when a tool
// of the server allows tasks, as exactly {} (ext-tasks 0.2.2 reads any
// other value as "no Tasks"). go-sdk v1.8.0 takes extensions only from
// ServerOptions.Capabilities, fixed when the server is made, before its
// tools are added; its discover answer holds a fresh copy of them
// (Server.capabilities clones the map on every call), so adding the
// extension to that copy here touches nothing shared.
func advertiseTasks(r *serverTools, res mcp.Result, err error) (mcp.Result, error) {
	dr, ok := res.(*mcp.DiscoverResult)
	if err != nil || !ok || dr.Capabilities == nil || !r.anyTasks() {
		return res, err
	}
	dr.Capabilities.AddExtension(ExtensionTasks, nil)
	return dr, nil
}

// warnPlainTool logs, once per name, a call to a tool that mcp.AddTool
// registered on a server of the layer. The server advertises idempotency,
// so a client retries it with a key, and the key does nothing for such a
// tool: a stranger who registered a side-effecting tool that way saw it
// run twice, and nothing said why. (The SDK answers an unknown tool with
// an error, which is not logged here.)
func (l *Layer) warnPlainTool(name string) {
	if _, seen := l.plainTools.LoadOrStore(name, struct{}{}); seen {
		return
	}
	l.logger.Warn("a tool registered with mcp.AddTool, not outbox.AddTool, was called: its calls are not recorded, "+
		"and a retry with the same key runs it again; register it with outbox.AddTool "+
		"(annotated readOnlyHint if it changes nothing)", "tool", name)
}
