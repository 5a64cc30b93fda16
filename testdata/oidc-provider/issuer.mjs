// A real authorization server for the authorization tests: the certified
// npm oidc-provider, configured as an MCP server's authorization server
// would be. Clients get JWT access tokens by client credentials, bound to
// the resource they name (RFC 8707 resource indicators): aud is the MCP
// endpoint's URL, and only scopes that resource offers are granted.
//
// Configuration from the environment:
//   OIDC_RESOURCE  the MCP endpoints' URLs (resource identifiers), space-separated;
//                  a client that names none gets the first
//   OIDC_SCOPES    the scopes the resource offers, space-separated
//   OIDC_CLIENTS   JSON: [{"client_id", "client_secret", "scope"}], the
//                  scopes each client may get
//   OIDC_OPAQUE    resources (of OIDC_RESOURCE) that get opaque access tokens,
//                  to be introspected (RFC 7662), instead of JWTs
//   OIDC_PORT      port to listen on, 127.0.0.1 (0 or unset: any free one)
// Prints {"issuer": URL} on one line of stdout once it listens; logs on
// stderr. Runs until killed.
import { createServer } from 'node:http';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import Provider, { errors } from 'oidc-provider';

const resources = (process.env.OIDC_RESOURCE ?? '').split(' ').filter(Boolean);
const scopes = (process.env.OIDC_SCOPES ?? '').split(' ').filter(Boolean);
const opaque = (process.env.OIDC_OPAQUE ?? '').split(' ').filter(Boolean);
const clients = JSON.parse(process.env.OIDC_CLIENTS ?? '[]');
if (resources.length === 0 || clients.length === 0) {
  console.error('issuer.mjs: set OIDC_RESOURCE and OIDC_CLIENTS');
  process.exit(2);
}

// Keys made at start: nothing secret is kept in the repository. RS256 for
// ID tokens (OpenID Connect's default), ES256 for access tokens.
function signingKey(type, options, alg) {
  const jwk = generateKeyPairSync(type, options).privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: randomUUID(), alg, use: 'sig' };
}
const keys = [
  signingKey('rsa', { modulusLength: 2048 }, 'RS256'),
  signingKey('ec', { namedCurve: 'P-256' }, 'ES256'),
];

// The issuer's URL has the port in it, so listen first and answer once
// the provider exists.
let handler = (_req, res) => {
  res.statusCode = 503;
  res.end();
};
const server = createServer((req, res) => handler(req, res));
server.listen(Number(process.env.OIDC_PORT ?? 0), '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: clients.map((c) => ({
      client_id: c.client_id,
      client_secret: c.client_secret,
      ...(c.scope ? { scope: c.scope } : {}),
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
    jwks: { keys },
    scopes: ['openid', ...scopes],
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => resources[0],
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, indicator) => {
          if (!resources.includes(indicator)) {
            throw new errors.InvalidTarget(`unknown resource ${indicator}`);
          }
          return {
            scope: scopes.join(' '),
            audience: indicator,
            accessTokenTTL: 5 * 60,
            ...(opaque.includes(indicator)
              ? { accessTokenFormat: 'opaque' }
              : { accessTokenFormat: 'jwt', jwt: { sign: { alg: 'ES256' } } }),
          };
        },
      },
    },
  });
  provider.on('server_error', (_ctx, err) => console.error('issuer.mjs: server_error', err));
  provider.on('grant.error', (_ctx, err) => console.error('issuer.mjs: grant.error', err.message, err.error_description ?? ''));
  provider.on('client_credentials.saved', (token) =>
    console.error(`issuer.mjs: issued an access token to ${token.clientId} for ${token.aud ?? token.resourceServer?.audience} scope "${token.scope ?? ''}"`),
  );
  const callback = provider.callback();
  handler = (req, res) => {
    console.error(`issuer.mjs: ${req.method} ${req.url}`);
    callback(req, res);
  };
  process.stdout.write(JSON.stringify({ issuer }) + '\n');
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
