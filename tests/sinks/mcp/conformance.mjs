// Conformance test of `ingero-pipeline mcp` driven by the official TypeScript MCP client
// (@modelcontextprotocol/sdk). Run by run_conformance.sh (ctest), which installs the SDK.
//   node conformance.mjs <ingero-pipeline binary> <shared data dir>
// Exits non-zero on the first failed check, printing what was expected and what came back.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, existsSync } from "node:fs";
import assert from "node:assert/strict";

const [bin, dataDir] = process.argv.slice(2);
const digest = (p) => createHash("sha256").update(readFileSync(p)).digest("hex");
const TOOLS = ["check_rule", "compare_traces", "explain_chain", "get_causal_chains", "get_check", "get_stacks",
               "get_trace_stats", "list_rules", "query_fleet", "run_sql", "thread_accounting", "why_not"];

function structured(result, tool) {
  assert.equal(result.isError, false, `${tool} failed: ${JSON.stringify(result.content)}`);
  assert.equal(result.content[0].type, "text");
  assert.deepEqual(JSON.parse(result.content[0].text), result.structuredContent, `${tool}: text != structuredContent`);
  return result.structuredContent;
}

async function exercise(client, db, expected) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
  for (const t of tools) {
    assert.equal(t.annotations?.readOnlyHint, true, `${t.name} readOnlyHint`);
    assert.equal(t.inputSchema.type, "object");
  }
  const { prompts } = await client.listPrompts();
  assert.deepEqual(prompts.map((p) => p.name), ["investigate"]);
  const prompt = await client.getPrompt({ name: "investigate", arguments: { focus: "cudaStreamSynchronize" } });
  assert.match(prompt.messages[0].content.text, /get_trace_stats[\s\S]*get_causal_chains[\s\S]*get_stacks[\s\S]*run_sql/);
  const { resources } = await client.listResources();
  assert.deepEqual(resources.map((r) => r.uri).sort(), ["ingero://rules/pack", "ingero://trace/summary"]);
  const summary = await client.readResource({ uri: "ingero://trace/summary" });
  assert.equal(JSON.parse(summary.contents[0].text).check.events.total, expected.events);

  const call = (name, args = {}) => client.callTool({ name, arguments: args });
  const check = structured(await call("get_check"), "get_check");
  assert.equal(check.events.total, expected.events, "get_check events.total");
  if (expected.gpu) assert.match(check.sessions[0].gpu, expected.gpu);

  const stats = structured(await call("get_trace_stats"), "get_trace_stats");
  const byOp = Object.fromEntries(stats.ops.map((o) => [o.op, o]));
  for (const [op, count] of Object.entries(expected.counts)) assert.equal(byOp[op]?.count, count, `count of ${op}`);
  for (const o of stats.ops) {
    assert.ok(o.p50_us <= o.p95_us && o.p95_us <= o.p99_us && o.p99_us <= o.max_us, `quantiles ordered for ${o.op}`);
  }

  const chains = structured(await call("get_causal_chains", { limit: 50 }), "get_causal_chains");
  assert.equal(chains.chains.length, Math.min(chains.total, 50));
  const rank = { HIGH: 2, MEDIUM: 1, LOW: 0 };
  for (let i = 1; i < chains.chains.length; i++)
    assert.ok(rank[chains.chains[i - 1].severity] >= rank[chains.chains[i].severity], "chains ranked by severity");
  if (expected.minChains) assert.ok(chains.total >= expected.minChains, `at least ${expected.minChains} chains`);
  if (chains.chains.length > 0) {
    const ex = structured(await call("explain_chain", { chain_id: chains.chains[0].id }), "explain_chain");
    assert.equal(ex.id, chains.chains[0].id);
    assert.ok(ex.provenance.predicates.every((p) => p.passed && typeof p.margin === "number"));
  }

  const stacks = structured(await call("get_stacks", { op: expected.stackOp, limit: 3 }), "get_stacks");
  assert.equal(stacks.calls, expected.counts[expected.stackOp]);
  if (expected.stacks) {
    assert.ok(stacks.stacks.length > 0, "stacks expected");
    assert.ok(stacks.stacks[0].frames.every((f) => !f.symbol || f.symbol.startsWith("<untrusted>")));
  }

  const sql = structured(await call("run_sql", { sql: "SELECT count(*) AS n FROM events" }), "run_sql");
  assert.deepEqual(sql.columns, ["n"]);
  assert.equal(sql.rows[0][0], expected.events);
  const denied = await call("run_sql", { sql: "DELETE FROM events" });
  assert.equal(denied.isError, true);
  assert.match(denied.content[0].text, /denied|read-only|not allowed/);

  const rules = structured(await call("list_rules"), "list_rules");
  assert.ok(rules.count > 0);
  const whyNot = structured(await call("why_not", { rule: rules.rules[0].name }), "why_not");
  assert.equal(whyNot.rule, rules.rules[0].name);
  assert.ok(typeof whyNot.verdict === "string" && whyNot.verdict.length > 0);

  // Where a GPU-feeding thread's time went: the parts add up to its wall time exactly.
  if (expected.feedingPid) {
    const acc = structured(await call("thread_accounting", { pid: expected.feedingPid }), "thread_accounting");
    const a = acc.accounting;
    const sum = (o) => Object.values(o).reduce((x, y) => x + y, 0);
    assert.equal(a.pid, expected.feedingPid);
    assert.equal(sum(a.in_calls_ns) + a.on_cpu_ns + a.preempted_ns + sum(a.blocked_ns) + a.unknown_ns, a.wall_ns);
  }
  const noThread = await call("thread_accounting", {});
  assert.equal(noThread.isError, true);
  assert.match(noThread.content[0].text, /give `tid`/);

  const cr = await call("check_rule", { text: "rule broken \"x\"\n  from cuda where\nend\n" });
  assert.equal(cr.isError !== undefined, true);
  if (!cr.isError) assert.ok(cr.structuredContent.errors > 0, "a broken rule must have errors");

  // Unknown tools are protocol errors; bad arguments are tool errors the model can read.
  await assert.rejects(call("no_such_tool"), /unknown tool/i);
  const bad = await call("get_stacks", {});
  assert.equal(bad.isError, true);
  assert.match(bad.content[0].text, /missing required argument `op`/);
}

const cases = [
  { db: "pytorch-dataloader-starvation.db", events: 3807, gpu: /RTX 4090/, stackOp: "cuMemAlloc", stacks: true,
    counts: { cudaLaunchKernel: 16, cuMemAlloc: 10, sched_switch: 3676 }, minChains: 1, feedingPid: 2233 },
  { db: "sample-cluster.db", events: 600, stackOp: "cuMemAlloc", counts: { cuMemAlloc: 76 } },
  { db: "sample-gpu-node-01.db", events: 200, stackOp: "sched_switch", counts: { sched_switch: 99 } },
];

let failures = 0;
for (const c of cases) {
  const path = `${dataDir}/${c.db}`;
  if (!existsSync(path)) {
    console.log(`SKIP ${c.db}: not found`);
    continue;
  }
  const before = digest(path);
  const client = new Client({ name: "ingero-conformance", version: "1.0.0" });
  const transport = new StdioClientTransport({ command: bin, args: ["mcp", "--db", path], stderr: "pipe" });
  try {
    await client.connect(transport);
    assert.equal(client.getServerVersion().name, "ingero-pipeline");
    await exercise(client, path, c);
    console.log(`ok   stdio ${c.db}`);
  } catch (e) {
    failures++;
    console.error(`FAIL stdio ${c.db}: ${e.stack || e}`);
  } finally {
    await client.close();
  }
  assert.equal(digest(path), before, `${c.db} changed`);
}

// Streamable HTTP on loopback with a bearer token.
{
  const c = cases[1];
  const path = `${dataDir}/${c.db}`;
  const token = "conformance-token-" + Math.random().toString(16).slice(2);
  const child = spawn(bin, ["mcp", "--db", path, "--http", "0", "--token", token], { stdio: ["ignore", "ignore", "pipe"] });
  let url = null;
  let stderr = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no HTTP address on stderr: " + stderr)), 20000);
    child.stderr.on("data", (d) => {
      stderr += d;
      const m = stderr.match(/(http:\/\/127\.0\.0\.1:\d+\/mcp)/);
      if (m && !url) { url = m[1]; clearTimeout(timer); resolve(); }
    });
    child.on("exit", (code) => reject(new Error(`server exited ${code}: ${stderr}`)));
  }).catch((e) => { failures++; console.error(`FAIL http start: ${e.message}`); });
  if (url) {
    try {
      const unauth = await fetch(url, { method: "POST", headers: { "content-type": "application/json" },
                                        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }) });
      assert.equal(unauth.status, 401);
      const client = new Client({ name: "ingero-conformance-http", version: "1.0.0" });
      const transport = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } } });
      await client.connect(transport);
      await exercise(client, path, c);
      await transport.terminateSession();
      await client.close();
      console.log(`ok   http  ${c.db}`);
    } catch (e) {
      failures++;
      console.error(`FAIL http ${c.db}: ${e.stack || e}`);
    }
  }
  child.kill("SIGTERM");
}

if (failures) {
  console.error(`${failures} conformance failure(s)`);
  process.exit(1);
}
console.log("MCP conformance: all checks passed");
