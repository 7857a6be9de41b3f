# wire.py OUT: the wire times of wire.sh's capture (see wire.sh), per side.
import sys, re, statistics
out = sys.argv[1]
for line in open(out + "/ports.txt"):
    side, p, s = line.split(); port = p.split("=")[1]; sim = s.split("=")[1]
    ev = []
    for l in open(f"{out}/{side}.pcap.txt"):
        m = re.match(r"(\d+\.\d+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+): .*length (\d+)", l)
        if not m or int(m.group(4)) == 0: continue
        t, sp, dp = float(m.group(1)), m.group(2), m.group(3)
        if dp == port: k = "C2P"
        elif dp == sim: k = "P2S"
        elif sp == sim: k = "S2P"
        elif sp == port: k = "P2C"
        else: continue
        ev.append((t, k))
    a, b, c, d = [], [], [], []
    i = 0
    while i < len(ev):
        if ev[i][1] == "C2P":
            t0 = ev[i][0]
            j = i + 1
            while j < len(ev) and ev[j][1] != "P2S": j += 1
            k = j + 1
            while k < len(ev) and ev[k][1] != "S2P": k += 1
            m = k + 1
            while m < len(ev) and ev[m][1] != "P2C": m += 1
            if m < len(ev):
                a.append((ev[j][0] - t0) * 1e6); b.append((ev[m][0] - ev[k][0]) * 1e6); c.append((ev[m][0] - t0) * 1e6)
                n2 = m + 1
                while n2 < len(ev) and ev[n2][1] not in ("P2C", "C2P"): n2 += 1
                if n2 < len(ev) and ev[n2][1] == "P2C" and (ev[n2][0] - ev[m][0]) < 0.005:
                    d.append((ev[n2][0] - ev[k][0]) * 1e6)
            i = m
        i += 1
    q = lambda x: "P50 %.0f P90 %.0f" % (statistics.median(x), sorted(x)[int(len(x) * .9)]) if x else "-"
    print(f"{side}: n={len(a)} in (client req -> upstream req) {q(a)} us; out (upstream first bytes -> client first bytes) {q(b)} us; client req -> first bytes to client {q(c)} us; a second packet to the client within 5 ms: {len(d)}, upstream first bytes -> it {q(d)} us")
