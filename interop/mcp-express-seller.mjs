// A seller's own MCP tool server as the official TypeScript SDK builds it
// (createMcpExpressApp: express.json() in front of the Streamable HTTP
// transport), stateless, JSON answers, with one tool, verify_schema, whose
// result is PAID-CONTENT. Prints {"url": ...} once listening; exits when
// stdin closes.
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';

const app = createMcpExpressApp({ host: '0.0.0.0' });
let runs = 0;
app.post('/mcp', async (req, res) => {
  const server = new McpServer({ name: 'seller', version: '1' });
  server.registerTool('verify_schema', { description: 'paid tool' }, async () => {
    runs++;
    return { content: [{ type: 'text', text: 'PAID-CONTENT run ' + runs }] };
  });
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => { transport.close(); server.close(); });
  await server.connect(transport);
  await transport.handleRequest(req, res, req.body);
});
app.get('/runs', (req, res) => res.json({ runs }));
const srv = app.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${srv.address().port}` }) + '\n');
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
