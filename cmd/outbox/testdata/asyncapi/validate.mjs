// Validates an AsyncAPI document (a file, or stdin) with @asyncapi/parser:
// prints every diagnostic as JSON lines and exits 1 if any is an error.
import { readFileSync } from 'node:fs';
import { Parser } from '@asyncapi/parser';

const text = readFileSync(process.argv[2] || 0, 'utf8');
const { document, diagnostics } = await new Parser().parse(text);
for (const d of diagnostics) {
  console.log(JSON.stringify({ severity: d.severity, code: d.code, message: d.message, path: d.path }));
}
const errors = diagnostics.filter((d) => d.severity === 0);
if (!document || errors.length > 0) process.exit(1);
console.log(JSON.stringify({ valid: true, version: document.version(), channels: document.channels().all().map((c) => c.id()),
  messages: document.components().messages().all().map((m) => m.id()) }));
