// The official TypeScript SDK client's OAuth support against mcp-outbox
// serve with --oauth-issuer (run by cmd/mcp-outbox/e2e/oauth_test.go).
//
//   node oauth.mjs URL CLIENT_ID CLIENT_SECRET KEY AMOUNT [SCOPE]
//
// The client is given nothing but the server's URL and its client
// credentials (and SCOPE, the scopes to ask for, when given): it must
// find the authorization server from the server's 401 (WWW-Authenticate
// resource_metadata) and RFC 9728 metadata, get a token
// by client credentials for this resource, then charge AMOUNT twice with
// idempotency key KEY over two connections (the second is a client's
// retry). Prints one JSON line: {"charges": [first, second], ...}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, clientId, clientSecret, key, amount, scope] = process.argv.slice(2);
if (!amount) {
  console.error('usage: node oauth.mjs URL CLIENT_ID CLIENT_SECRET KEY AMOUNT');
  process.exit(2);
}

// Every request the SDK makes, to show the discovery on stderr.
const seen = [];
async function tracingFetch(input, init) {
  const res = await fetch(input, init);
  const target = input instanceof Request ? input.url : String(input);
  const method = init?.method ?? (input instanceof Request ? input.method : 'GET');
  seen.push({ method, url: target, status: res.status, challenge: res.headers.get('www-authenticate') ?? undefined });
  // A token request's form carries no secret (client_secret_basic sends
  // it in the Authorization header): show what was asked for.
  const form = init?.body instanceof URLSearchParams ? ` ${init.body}` : '';
  console.error(`oauth.mjs: ${method} ${target}${form} -> ${res.status}`);
  return res;
}

async function charge(provider) {
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: tracingFetch });
  const client = new Client({ name: 'oauth-client-credentials', version: '0.0.0' });
  await client.connect(transport);
  try {
    const res = await client.callTool({ name: 'charge', arguments: { amount: Number(amount) }, _meta: { idempotencyKey: key } });
    return { isError: res.isError ?? false, chargeId: res.structuredContent?.charge_id ?? null,
      replayed: res._meta?.['mcp-outbox/replayed'] ?? res.structuredContent?.mcp_outbox !== undefined };
  } finally {
    await client.close();
  }
}

// The SDK (1.32.2) asks the token endpoint for the provider's scope only:
// the scope of a 403 insufficient_scope challenge, which it does read for
// its "upscoping", does not reach a client-credentials token request. So a
// server that requires scopes needs SCOPE here.
//
// One provider per connection: the second starts without a token, as a
// client process that restarted would, and goes through discovery again.
const providers = [0, 1].map(() => new ClientCredentialsProvider({ clientId, clientSecret, scope }));
const charges = [];
for (const p of providers) {
  charges.push(await charge(p));
}
console.log(JSON.stringify({ charges, tokenScope: providers[0].tokens()?.scope ?? null, requests: seen }));
