import os, time, sys
HZ = os.sysconf('SC_CLK_TCK')
def total():
    f = open('/proc/stat').readline().split()[1:]
    v = list(map(int, f)); idle = v[3] + v[4]
    return sum(v), idle
def procs():
    out = {}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            s = open(f'/proc/{p}/stat').read()
            rp = s.rfind(')'); fields = s[rp+2:].split()
            t = int(fields[11]) + int(fields[12])
            cmd = open(f'/proc/{p}/cmdline','rb').read().replace(b'\0', b' ').decode(errors='replace')[:90]
            out[p] = (t, cmd or s[s.find('(')+1:rp])
        except Exception: pass
    return out
t0 = time.time(); a, ai = total(); pa = procs()
log = open(sys.argv[1], 'w', buffering=1)
while True:
    time.sleep(2)
    b, bi = total(); pb = procs()
    busy = 100 * (1 - (bi - ai) / max(1, b - a)) * os.cpu_count()
    deltas = sorted(((pb[p][0] - pa.get(p, (pb[p][0], ''))[0]) / HZ / 2 * 100, pb[p][1]) for p in pb)
    top = [f"{d:.0f}%:{c}" for d, c in reversed(deltas[-4:]) if d >= 5]
    log.write(f"{time.time()-t0:7.1f} busy={busy:5.0f}% | " + " || ".join(top) + "\n")
    a, ai, pa = b, bi, pb
