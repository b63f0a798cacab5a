# Session 39 offline analysis of call 3 (W3 8 of 32, --host-syncs off). Run in the folder that
# call3/1-W3-c8-nosync/saved.tar.xz extracts to, after
#   teraio simulate W3-79GiB-teraio-recompute-trace.tiotrace W3-79GiB-teraio-recompute-plan.json \
#       --enforce-budget --budget 74GiB --timeline tl.json --csv ops.csv
import json, csv, collections, statistics as st
waits = json.load(open('W3-79GiB-teraio-recompute-device-waits.json'))['steps'][-1]['waits']
tl = json.load(open('tl.json'))['traceEvents']
start = {}
with open('ops.csv') as f:
    for row in csv.DictReader(f):
        start[int(row['op'])] = float(row['start_s'])
mig = [e for e in tl if e.get('cat') == 'migration' and e['name'].startswith('prefetch')]
by_deadline = collections.defaultdict(list)
for e in mig:
    end = (e['ts'] + e['dur']) / 1e6
    d = e['args']['deadline']
    by_deadline[d].append((start[d] - end, e['args']['bytes'], e))
waited = collections.defaultdict(float)
for op, kind, sec, how, *_ in waits:
    if kind == 'copy in':
        waited[op] += sec
slacks_all = [s for v in by_deadline.values() for s, b, e in v]
print('prefetches', len(slacks_all), 'slack median %.2f ms' % (st.median(slacks_all) * 1e3),
      'share under 1 ms %.2f' % (sum(s < 1e-3 for s in slacks_all) / len(slacks_all)))
buckets = collections.Counter(); wait_by = collections.Counter()
for op, sec in waited.items():
    v = by_deadline.get(op)
    if not v: 
        buckets['no prefetch due'] += 1; wait_by['no prefetch due'] += sec; continue
    s = min(x[0] for x in v)
    key = 'slack<0 (sim stalls)' if s < 0 else 'slack<0.5ms' if s < 5e-4 else 'slack<2ms' if s < 2e-3 else 'slack<10ms' if s < 1e-2 else 'slack>=10ms'
    buckets[key] += 1; wait_by[key] += sec
for k in sorted(buckets):
    print(f'{k:22s} ops {buckets[k]:5d} measured wait {wait_by[k]:.3f} s')
# all prefetch-due ops by slack bucket (how many ops exist)
allb = collections.Counter()
for op, v in by_deadline.items():
    s = min(x[0] for x in v)
    key = 'slack<0 (sim stalls)' if s < 0 else 'slack<0.5ms' if s < 5e-4 else 'slack<2ms' if s < 2e-3 else 'slack<10ms' if s < 1e-2 else 'slack>=10ms'
    allb[key] += 1
print('ops with a prefetch due, by slack:', dict(allb))
big = []
for op, sec in waited.items():
    v = by_deadline.get(op)
    if v and min(x[0] for x in v) >= 1e-2:
        big.append((sec, op, min(x[0] for x in v), sum(x[1] for x in v)))
big.sort(reverse=True)
secs = sorted(s for s, *_ in big)
print('waits at >=10ms-slack ops: n', len(secs), 'median %.3f ms' % (st.median(secs)*1e3), 'p90 %.3f ms' % (secs[int(.9*len(secs))]*1e3), 'max %.1f ms' % (secs[-1]*1e3))
print('  sum of those over 1 ms: %.3f s (%d)' % (sum(s for s in secs if s > 1e-3), sum(1 for s in secs if s > 1e-3)))
for s, op, sl, b in big[:8]:
    print(f'  op {op}: waited {s*1e3:.1f} ms, sim slack {sl*1e3:.1f} ms, {b/2**20:.1f} MiB due')
