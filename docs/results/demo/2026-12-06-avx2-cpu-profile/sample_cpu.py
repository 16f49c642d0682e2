import os, time, sys, json
HZ = os.sysconf("SC_CLK_TCK")
def cat(cmd):
    if "vllm" in cmd or "VllmWorker" in cmd or "EngineCore" in cmd: return "vllm"
    if "carl train" in cmd or "bin/carl" in cmd: return "trainer"
    if "pytest" in cmd or "bwrap" in cmd or "python" in cmd: return "sandbox"
    return "other"
seen = {}   # pid -> (cat, last ticks)
out = open(sys.argv[1], "w")
t0 = time.time()
while True:
    tot = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            st = open(f"/proc/{pid}/stat").read()
            f = st.rsplit(")", 1)[1].split()
            ticks = int(f[11]) + int(f[12])  # utime stime
            if pid not in seen:
                cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
                comm = st.split("(",1)[1].rsplit(")",1)[0]
                seen[pid] = [cat(cmd + " " + comm), 0]
            c, last = seen[pid]
            tot[c] = tot.get(c, 0) + (ticks - last)
            seen[pid][1] = ticks
            if c == "trainer":
                ch = int(f[13]) + int(f[14])
                key = pid + "/children"
                prev = seen.get(key, [None, 0])[1]
                tot["reaped_children"] = tot.get("reaped_children", 0) + ch - prev
                seen[key] = [None, ch]
        except Exception:
            pass
    cpu = open("/proc/stat").readline().split()[1:]
    busy = sum(map(int, cpu)) - int(cpu[3]) - int(cpu[4])
    tot["machine_busy"] = busy - seen.get("busy", [None, busy])[1]; seen["busy"] = [None, busy]
    out.write(json.dumps({"t": round(time.time() - t0, 1), **{k: v / HZ for k, v in tot.items()}}) + "\n"); out.flush()
    time.sleep(5)
