# The swap-in counts of every step of every run under DIR (timing fields left out), as one JSON.
import json, sys, glob, os
d = sys.argv[1]
keys = ['admitted','bytes_d2h','bytes_h2d','bytes_h2d_prefetch','bytes_prompt_device','bytes_prompt_host',
        'finished','hits','max_misses','misses','prefetch_useful','prefetch_wasted','prefetched','queued',
        'rejected','running','step','tokens','device_bytes_in_use','host_bytes_in_use']
out = {}
for f in sorted(glob.glob(os.path.join(d, 'r-*/run.json'))):
    runs = json.load(open(f))
    out[f.split('/')[-2]] = [[{k: s.get(k) for k in keys} for s in r['steps']] for r in runs]
json.dump(out, open(os.path.join(d, 'step-counts.json'), 'w'), sort_keys=True)
print(len(out), 'runs')
