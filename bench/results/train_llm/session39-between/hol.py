# Session 39 offline analysis of call 3 (W3 8 of 32, --host-syncs off). Run in the folder that
# call3/1-W3-c8-nosync/saved.tar.xz extracts to, after
#   teraio simulate W3-79GiB-teraio-recompute-trace.tiotrace W3-79GiB-teraio-recompute-plan.json \
#       --enforce-budget --budget 74GiB --timeline tl.json --csv ops.csv
import json, collections
waits = json.load(open('W3-79GiB-teraio-recompute-device-waits.json'))['steps'][-1]['waits']
plan = json.load(open('W3-79GiB-teraio-recompute-plan.json'))['migrations']
due = collections.defaultdict(list)
for m in plan:
    if m['direction'] == 'prefetch':
        due[m['deadline']].append(m)
idx = {}
for i, w in enumerate(waits):
    idx.setdefault(w[0], i)
for target in (145280, 139807, 18340, 160219, 155088):
    i = idx[target]
    print(f'--- op {target}')
    for w in waits[max(0, i - 12): i + 2]:
        op, kind, sec, how, at = w[:5]
        sizes = [m['bytes'] >> 20 for m in due.get(op, [])] if kind == 'copy in' else []
        issue = [m['issue_before'] for m in due.get(op, [])] if kind == 'copy in' else []
        print(f'  op {op:6d} {kind:9s} {how:8s} wait {sec*1e3:7.3f} ms at {at:8.4f}s  due MiB {sizes} issued at {issue}')
