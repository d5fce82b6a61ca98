// Side-by-side of ingero-pipeline and DuckDB (one thread) on the same Ingero SQLite trace.
//
//   node bench/duckdb/compare.mjs [--trace /tmp/big5m.db] [--bin build/ingero-pipeline]
//        [--work /tmp/ingero-duck] [--reuse-csv] [--ours "bench --json ..."] [--markdown FILE]
//        [--rounds N]
//
// What it does, in one process run:
// 1. export: DuckDB's sqlite extension is downloaded on demand (it is not in the npm package) and
//    this machine cannot reach extensions.duckdb.org, so the events table is exported to CSV with
//    the sqlite3 CLI over an immutable=1 URI (the trace is never written). Timed on its own.
// 2. load: the CSV into a DuckDB in-memory table (SET threads=1). Wall and process CPU seconds.
// 3. queries, each timed alone (load excluded) and reported with load added (load included):
//    stats          per (pid, source, op): count, mean, p50/p95/p99 (quantile_disc), max
//    tail_offcpu_p99    slow calls (CUDA/driver rows with duration > p99 of their key) that overlap
//                   off-CPU spans of the same tid: sched_switch rows, stored at their END
//                   timestamp, so span = [timestamp - duration, timestamp]
//    tail_offcpu_rule   the same join with the rule pack's threshold (cpu_contention:
//                   duration >= max(p95, 3 * p50)), to cross-check the counts with our chains
// 4. ours: `ingero-pipeline bench --trace T --json` under /usr/bin/time, in the same run.
// 5. --rounds N (N > 1): N more rounds of DuckDB's (a) stats and (b) p99 join on the loaded table,
//    each followed by `bench --trace T --no-per-rule --json` (its run phase), with each round's
//    ratio and the median ratio: both sides move by a third between identical runs on a small VM
//    (docs/history/issue-12.md, part 18), so one round says little.
// Prints one JSON document on stdout; --markdown FILE also writes the side-by-side table.
import { DuckDBInstance } from '@duckdb/node-api';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

function parseArgs(argv) {
  const a = { trace: '/tmp/big5m.db', bin: 'build/ingero-pipeline', work: '/tmp/ingero-duck', reuseCsv: false,
              ours: null, markdown: null, rounds: 1 };
  for (let i = 2; i < argv.length; ++i) {
    const k = argv[i];
    const v = () => { if (i + 1 >= argv.length) throw new Error(`${k} needs a value`); return argv[++i]; };
    if (k === '--trace') a.trace = v();
    else if (k === '--bin') a.bin = v();
    else if (k === '--work') a.work = v();
    else if (k === '--reuse-csv') a.reuseCsv = true;
    else if (k === '--ours') a.ours = v();
    else if (k === '--markdown') a.markdown = v();
    else if (k === '--rounds') {
      a.rounds = Number(v());
      if (!Number.isInteger(a.rounds) || a.rounds < 1) throw new Error('--rounds needs a whole number >= 1');
    }
    else throw new Error(`unknown argument ${k}`);
  }
  return a;
}

const cpuS = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const rssMiB = () => process.memoryUsage().rss / 2 ** 20;
const peakMiB = () => process.resourceUsage().maxRSS / 1024;  // KB -> MiB, whole process so far

async function timed(fn) {
  const t0 = process.hrtime.bigint(), c0 = cpuS();
  const value = await fn();
  return { value, seconds: Number(process.hrtime.bigint() - t0) / 1e9, cpu_seconds: cpuS() - c0,
           rss_mib: rssMiB(), peak_rss_mib: peakMiB() };
}

// Runs a command under /usr/bin/time; returns its stdout and wall/CPU/maxRSS.
function timedCommand(cmd, args, opts = {}) {
  const tf = path.join(os.tmpdir(), `duck-time-${process.pid}.txt`);
  const r = spawnSync('/usr/bin/time', ['-o', tf, '-f', '%e %U %S %M', cmd, ...args],
                      { maxBuffer: 1 << 30, encoding: 'utf8', ...opts });
  if (r.error) throw r.error;
  const [wall, user, sys, kb] = fs.readFileSync(tf, 'utf8').trim().split(/\s+/).slice(-4).map(Number);
  fs.rmSync(tf, { force: true });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, seconds: wall, cpu_seconds: user + sys,
           peak_rss_mib: kb / 1024 };
}

const CALLS = 'source IN (1, 4)';           // CUDA runtime, driver
const OFFCPU = 'source = 3 AND op = 1';     // HOST sched_switch

const QUERIES = {
  stats: `
    SELECT pid, source, op, count(*) AS n, avg(duration) AS mean,
           quantile_disc(duration, 0.50) AS p50, quantile_disc(duration, 0.95) AS p95,
           quantile_disc(duration, 0.99) AS p99, max(duration) AS max
    FROM events GROUP BY pid, source, op ORDER BY pid, source, op`,
  tail_offcpu_p99: tailJoin('e.duration > k.p99'),
  tail_offcpu_rule: tailJoin('e.duration >= greatest(k.p95, 3 * k.p50)'),
};

function tailJoin(slowCondition) {
  return `
    WITH k AS (SELECT pid, source, op, quantile_disc(duration, 0.50) AS p50,
                      quantile_disc(duration, 0.95) AS p95, quantile_disc(duration, 0.99) AS p99
               FROM events WHERE ${CALLS} GROUP BY pid, source, op),
         slow AS (SELECT e.id, e.tid, e.timestamp AS s, e.timestamp + e.duration AS t
                  FROM events e JOIN k USING (pid, source, op) WHERE ${slowCondition}),
         off AS (SELECT tid, timestamp - duration AS s, timestamp AS t FROM events WHERE ${OFFCPU}),
         hits AS (SELECT slow.id, least(slow.t, off.t) - greatest(slow.s, off.s) AS overlap
                  FROM slow JOIN off ON slow.tid = off.tid AND off.s < slow.t AND off.t > slow.s)
    SELECT (SELECT count(*) FROM slow) AS slow_calls,
           (SELECT sum(t - s) FROM slow) AS slow_ns,
           count(DISTINCT id) AS hit_calls, coalesce(sum(overlap), 0) AS overlap_ns FROM hits`;
}

function loadavg() { return os.loadavg().map((x) => x.toFixed(2)).join(' '); }

async function main() {
  const a = parseArgs(process.argv);
  if (!fs.existsSync(a.trace)) throw new Error(`no trace at ${a.trace}`);
  fs.mkdirSync(a.work, { recursive: true });
  const csv = path.join(a.work, path.basename(a.trace).replace(/\.[^.]*$/, '') + '.events.csv');
  const out = { trace: a.trace, machine: { cpus: os.cpus().length, loadavg_start: loadavg() } };

  // 1. Export (sqlite3 CLI, read-only immutable URI).
  if (!(a.reuseCsv && fs.existsSync(csv))) {
    const uri = `file:${a.trace}?immutable=1`;
    const r = timedCommand('sh', ['-c', `sqlite3 -csv '${uri}' 'SELECT id, timestamp, pid, tid, source, op, duration FROM events' > '${csv}'`]);
    if (r.status !== 0) throw new Error(`sqlite3 export failed: ${r.stderr}`);
    out.export = { tool: 'sqlite3 -csv', csv, bytes: fs.statSync(csv).size, seconds: r.seconds,
                   cpu_seconds: r.cpu_seconds, peak_rss_mib: r.peak_rss_mib };
  } else {
    out.export = { tool: 'reused', csv, bytes: fs.statSync(csv).size };
  }

  // 2. DuckDB load, one thread.
  const inst = await DuckDBInstance.create(':memory:', { threads: '1' });
  const con = await inst.connect();
  await con.run('SET threads = 1');
  const version = (await con.runAndReadAll('SELECT version()')).getRows()[0][0];
  const threads = (await con.runAndReadAll("SELECT current_setting('threads')")).getRows()[0][0];
  out.duckdb = { package: '@duckdb/node-api', version, threads: Number(threads) };
  try {
    await con.run('INSTALL sqlite');
    out.duckdb.sqlite_extension = 'installed';
  } catch (e) {
    out.duckdb.sqlite_extension = `unavailable: ${e.message.split('\n')[0]}`;
  }
  const load = await timed(() => con.run(`
    CREATE TABLE events AS SELECT * FROM read_csv('${csv}', header = false,
      columns = {'id': 'BIGINT', 'timestamp': 'BIGINT', 'pid': 'INTEGER', 'tid': 'INTEGER',
                 'source': 'TINYINT', 'op': 'TINYINT', 'duration': 'BIGINT'})`));
  const rows = Number((await con.runAndReadAll('SELECT count(*) FROM events')).getRows()[0][0]);
  out.duckdb.load = { rows, seconds: load.seconds, cpu_seconds: load.cpu_seconds, rss_mib: load.rss_mib,
                      peak_rss_mib: load.peak_rss_mib };

  // 3. Queries.
  out.duckdb.queries = {};
  for (const [name, sql] of Object.entries(QUERIES)) {
    const q = await timed(async () => (await con.runAndReadAll(sql)).getRowObjectsJson());
    out.duckdb.queries[name] = {
      seconds: q.seconds, cpu_seconds: q.cpu_seconds,
      seconds_with_load: q.seconds + load.seconds, cpu_seconds_with_load: q.cpu_seconds + load.cpu_seconds,
      rss_mib: q.rss_mib, peak_rss_mib: q.peak_rss_mib, rows: q.value.length,
      result: name === 'stats' ? q.value.slice(0, 3) : q.value,
    };
  }
  // 5. More rounds, each ratio taken in its own round.
  if (a.rounds > 1) {
    out.rounds = [];
    for (let i = 0; i < a.rounds; ++i) {
      const qa = await timed(async () => (await con.runAndReadAll(QUERIES.stats)).getRowObjectsJson());
      const qb = await timed(async () => (await con.runAndReadAll(QUERIES.tail_offcpu_p99)).getRowObjectsJson());
      const args = ['bench', '--trace', a.trace, '--no-per-rule', '--json'];
      const r = timedCommand(a.bin, args);
      if (r.status !== 0) throw new Error(`${a.bin} ${args.join(' ')} failed (${r.status}): ${r.stderr}`);
      const run = JSON.parse(r.stdout).phases.run;
      const duck = qa.cpu_seconds + qb.cpu_seconds;
      out.rounds.push({ loadavg: loadavg(), duckdb_ab_cpu_seconds: duck, duckdb_ab_seconds: qa.seconds + qb.seconds,
                        ours_run_cpu_seconds: run.cpu_seconds, ours_run_seconds: run.seconds,
                        ratio: duck / run.cpu_seconds });
    }
    const sorted = out.rounds.map((x) => x.ratio).sort((x, y) => x - y);
    const mid = sorted.length >> 1;
    out.rounds_median_ratio = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  }
  con.closeSync?.();
  out.duckdb.process_peak_rss_mib = peakMiB();

  // 4. Ours, same run.
  const oursArgs = a.ours ? a.ours.split(/\s+/).filter(Boolean) : ['bench', '--trace', a.trace, '--json'];
  const r = timedCommand(a.bin, oursArgs);
  if (r.status !== 0) throw new Error(`${a.bin} ${oursArgs.join(' ')} failed (${r.status}): ${r.stderr}`);
  const bench = JSON.parse(r.stdout);
  const rule = (n) => (bench.per_rule || []).find((x) => x.rule === n) || null;
  out.ours = { command: `${a.bin} ${oursArgs.join(' ')}`, process: { seconds: r.seconds, cpu_seconds: r.cpu_seconds,
               peak_rss_mib: r.peak_rss_mib }, bench };
  out.machine.loadavg_end = loadavg();

  const md = markdown(out, rule);
  if (a.markdown) fs.writeFileSync(a.markdown, md);
  process.stdout.write(JSON.stringify(out, null, 2) + '\n');
  process.stderr.write(md);
}

function f(x, d = 2) { return x === undefined || x === null ? 'n/a' : Number(x).toFixed(d); }

function markdown(out, rule) {
  const d = out.duckdb, b = out.ours.bench, ph = b.phases || {};
  const ev = b.events;
  const rate = (s) => (s > 0 ? `${(ev / s / 1e6).toFixed(2)} M/s` : 'n/a');
  const lines = [];
  lines.push(`Trace ${out.trace}: ${ev} events (DuckDB table: ${d.load.rows} rows). ${out.machine.cpus} CPUs, ` +
             `load average ${out.machine.loadavg_start} at start, ${out.machine.loadavg_end} at end. ` +
             `DuckDB ${d.version}, threads=${d.threads}; ingero-pipeline ${b.threads} thread(s), ${b.analysis}.`);
  lines.push('');
  lines.push('| step | DuckDB wall s | DuckDB CPU s | ingero-pipeline wall s | ingero-pipeline CPU s | notes |');
  lines.push('|---|---:|---:|---:|---:|---|');
  if (out.export.seconds !== undefined)
    lines.push(`| export SQLite -> CSV (sqlite3 CLI) | ${f(out.export.seconds)} | ${f(out.export.cpu_seconds)} | - | - | DuckDB only: no sqlite extension offline |`);
  lines.push(`| load | ${f(d.load.seconds)} | ${f(d.load.cpu_seconds)} | ${f(ph.load?.seconds)} | ${f(ph.load?.cpu_seconds)} | DuckDB: CSV -> table; ours: SQLite -> in-memory batches (${f((b.rss_after_load_bytes || 0) / 2 ** 20, 0)} MiB RSS) |`);
  const s = d.queries.stats, t = d.queries.tail_offcpu_p99, tr = d.queries.tail_offcpu_rule;
  const cc = rule('cpu_contention');
  lines.push(`| per-op stats (a) | ${f(s.seconds)} | ${f(s.cpu_seconds)} | - | - | ${s.rows} keys; ours computes them inside the pack run |`);
  lines.push(`| tail x off-CPU join, > p99 (b) | ${f(t.seconds)} | ${f(t.cpu_seconds)} | - | - | ${t.result[0].hit_calls} of ${t.result[0].slow_calls} slow calls hit |`);
  lines.push(`| tail x off-CPU join, rule threshold | ${f(tr.seconds)} | ${f(tr.cpu_seconds)} | ${f(cc?.run_seconds)} | ${f(cc?.run_cpu_seconds)} | ours: cpu_contention alone, from memory; ${tr.result[0].hit_calls} of ${tr.result[0].slow_calls} slow calls hit (DuckDB) |`);
  lines.push(`| (a) + (b), load excluded | ${f(s.seconds + t.seconds)} | ${f(s.cpu_seconds + t.cpu_seconds)} | ${f(ph.run?.seconds)} | ${f(ph.run?.cpu_seconds)} | ours: the whole pack (${b.per_rule?.length ?? '?'} rules + stats) from memory, ${rate(ph.run?.seconds)} |`);
  lines.push(`| (a) + (b), load included | ${f(d.load.seconds + s.seconds + t.seconds)} | ${f(d.load.cpu_seconds + s.cpu_seconds + t.cpu_seconds)} | ${f(ph.end_to_end?.seconds)} | ${f(ph.end_to_end?.cpu_seconds)} | ours: end-to-end streamed from the SQLite file, ${rate(ph.end_to_end?.seconds)}; DuckDB excludes the CSV export |`);
  lines.push(`| peak RSS | ${f(d.process_peak_rss_mib, 0)} MiB | | ${f(ph.end_to_end?.peak_rss_bytes / 2 ** 20, 0)} MiB streamed, ${f(b.peak_rss_bytes / 2 ** 20, 0)} MiB with the preloaded trace | | DuckDB: node process (table + queries) |`);
  lines.push('');
  if (out.rounds) {
    lines.push(`Rounds (DuckDB's (a) + (b) on the loaded table, then our bench --no-per-rule run phase; ratio of CPU seconds): median ${f(out.rounds_median_ratio, 1)}x.`);
    lines.push('');
    lines.push('| round | load average | DuckDB (a) + (b) CPU s | ours, run phase CPU s | ratio |');
    lines.push('|---:|---|---:|---:|---:|');
    out.rounds.forEach((x, i) => lines.push(`| ${i + 1} | ${x.loadavg} | ${f(x.duckdb_ab_cpu_seconds)} | ${f(x.ours_run_cpu_seconds)} | ${f(x.ratio, 1)}x |`));
    lines.push('');
  }
  return lines.join('\n') + '\n';
}

main().catch((e) => { process.stderr.write(`compare.mjs: ${e.stack || e}\n`); process.exit(1); });
