package e2e

import (
	"fmt"
	"html"
	"sort"
	"strings"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// traceSVG draws the spans of one trace as a waterfall, the way trace
// viewers do: a row per span, indented under its parent, its bar placed on
// a common time axis, with the attributes that tell the story beside it.
// The client's span, which the test client does not export, heads the
// picture as the remote parent it is.
func traceSVG(traceID, clientSpan string, spans []exported) string {
	sort.Slice(spans, func(i, j int) bool { return spans[i].span.StartTimeUnixNano < spans[j].span.StartTimeUnixNano })
	depth := map[string]int{clientSpan: 0}
	start, end := spans[0].span.StartTimeUnixNano, spans[0].span.EndTimeUnixNano
	for _, e := range spans {
		start = min(start, e.span.StartTimeUnixNano)
		end = max(end, e.span.EndTimeUnixNano)
	}
	for range spans { // parents first, whatever the order
		for _, e := range spans {
			if d, ok := depth[hexID(e.span.ParentSpanId)]; ok {
				depth[hexID(e.span.SpanId)] = d + 1
			}
		}
	}
	const (
		width   = 1100
		labelW  = 330
		barX    = labelW + 10
		barW    = width - barX - 30
		rowH    = 58
		top     = 74
		barH    = 16
		fontSub = 11
	)
	total := float64(end - start)
	x := func(t uint64) float64 { return barX + float64(t-start)/total*barW }
	height := top + rowH*(len(spans)+1) + 24

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="16" y="26" font-size="16" font-weight="bold">Trace %s</text>`+"\n", traceID)
	fmt.Fprintf(&b, `<text x="16" y="46" font-size="12" fill="#555">exported by mcp-outbox serve over OTLP/HTTP (TestTraceEndToEnd); %.1f ms from the first span's start to the last one's end</text>`+"\n", total/1e6)
	// Time axis.
	for i := 0; i <= 4; i++ {
		tx := barX + float64(barW)*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e3e3"/>`+"\n", tx, top-8, tx, height-30)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#777" text-anchor="middle">%.1f ms</text>`+"\n", tx, top-12, total/1e6*float64(i)/4)
	}
	row := func(i, d int, title, sub string) (y int) {
		y = top + i*rowH
		if i%2 == 1 {
			fmt.Fprintf(&b, `<rect x="0" y="%d" width="%d" height="%d" fill="#f7f7f9"/>`+"\n", y-4, width, rowH)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", 16+d*18, y+13, html.EscapeString(title))
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="%d" fill="#555">%s</text>`+"\n", 16+d*18, y+29, fontSub, html.EscapeString(sub))
		return y
	}
	y := row(0, 0, "agent's tools/call (client)", "span "+clientSpan+", not exported: the remote parent")
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999" stroke-dasharray="4 3"/>`+"\n", barX, y+2, barW, barH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" fill="#777">traceparent sent in params._meta</text>`+"\n", barX+6, y+14)

	colors := map[tracepb.Span_SpanKind]string{tracepb.Span_SPAN_KIND_SERVER: "#3b7dd8", tracepb.Span_SPAN_KIND_CLIENT: "#e0883b"}
	for i, e := range spans {
		s := e.span
		kind := strings.ToLower(strings.TrimPrefix(s.Kind.String(), "SPAN_KIND_"))
		y := row(i+1, depth[hexID(s.SpanId)], s.Name+"  ("+kind+")", e.service+", span "+hexID(s.SpanId))
		x0, x1 := x(s.StartTimeUnixNano), x(s.EndTimeUnixNano)
		fill := colors[s.Kind]
		if fill == "" {
			fill = "#888"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="%s"/>`+"\n", x0, y+2, max(x1-x0, 2), barH, fill)
		dur := float64(s.EndTimeUnixNano-s.StartTimeUnixNano) / 1e6
		label := fmt.Sprintf("%.2f ms", dur)
		lx, anchor := x1+6, "start"
		if x1 > barX+barW*0.8 {
			lx, anchor = x0-6, "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11" text-anchor="%s">%s</text>`+"\n", lx, y+14, anchor, label)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="%d" fill="#333">%s</text>`+"\n", barX, y+36, fontSub, html.EscapeString(spanSummary(s)))
	}
	fmt.Fprintf(&b, `<text x="16" y="%d" font-size="11" fill="#555">blue: SERVER span of an MCP request; orange: CLIENT span of a delivery attempt (child of, and linked to, the call that enqueued it). Keys appear as hashes only.</text>`+"\n", height-12)
	b.WriteString("</svg>\n")
	return b.String()
}

// spanSummary is the line of attributes shown under a span's bar.
func spanSummary(s *tracepb.Span) string {
	var parts []string
	for _, k := range []string{"mcp_outbox.outcome", "mcp_outbox.key_source", "mcp_outbox.key_hash", "mcp_outbox.call_id",
		"mcp_outbox.effects_enqueued", "mcp_outbox.destination", "mcp_outbox.effect.seq", "http.response.status_code", "mcp_outbox.delivery.result"} {
		if v := attrString(s.Attributes, k); v != "" {
			parts = append(parts, strings.TrimPrefix(k, "mcp_outbox.")+"="+v)
		}
	}
	if len(s.Links) > 0 {
		parts = append(parts, fmt.Sprintf("link→%s", hexID(s.Links[0].SpanId)))
	}
	return strings.Join(parts, "  ")
}
