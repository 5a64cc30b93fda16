// Package clientaddr names the client a request or connection counts
// against, for the limits the HTTP surfaces put on one client: failed
// logins and guessed tokens, open connections, requests in flight.
package clientaddr

import (
	"net"
	"net/netip"
)

// Of is whom a peer at remote (host:port, as http.Request.RemoteAddr and
// net.Conn.RemoteAddr give it) counts as: the TCP peer's address, never a
// header a client could set (X-Forwarded-For), so that behind a reverse
// proxy every client counts as the proxy. An IPv6 client counts as its
// /64, which one host usually has to itself and can hop around in freely.
func Of(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip = ip.Unmap(); ip.Is6() {
		return netip.PrefixFrom(ip.WithZone(""), 64).Masked().String()
	}
	return ip.String()
}
