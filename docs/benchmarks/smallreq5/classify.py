# classify.py BIN PROFILE: the CPU samples of a `sluice serve` profile by stack, in the
# categories of BENCHMARKS.md "smallreq5" (the first rule that matches a stack wins).
import sys, re, subprocess, collections
binp, prof = sys.argv[1], sys.argv[2]
out = subprocess.run(["go","tool","pprof","-traces",binp,prof],capture_output=True,text=True).stdout
blocks = out.split("-----------+-------------------------------------------------------")
tot=0; cats=collections.Counter(); sysc=collections.Counter()
def val(s):
    s=s.strip()
    m=re.match(r'([\d.]+)(ms|s|us|µs)',s)
    v=float(m.group(1)); u=m.group(2)
    return v*{'s':1000,'ms':1,'us':1e-3,'µs':1e-3}[u]
rules = [
 # (category, predicate over frames list (leaf first))
]
for b in blocks:
    lines=[l for l in b.strip().split("\n") if l.strip()]
    if not lines: continue
    m=re.match(r'\s*([\d.]+\w+)\s+(\S+)',lines[0])
    if not m or 'File:' in lines[0] or 'Type:' in lines[0]: continue
    try: v=val(m.group(1))
    except Exception: continue
    frames=[m.group(2)]+[l.strip() for l in lines[1:]]
    tot+=v
    s=" ".join(frames)
    leaf=frames[0]
    issys = 'Syscall6' in leaf or 'runtime.futex' in leaf or 'usleep' in leaf or 'nanotime' in leaf or 'epollwait' in leaf or 'madvise' in leaf or 'osyield' in leaf
    def has(x): return x in s
    if has('gcBgMarkWorker') or has('gcDrain') or has('bgsweep') or has('bgscavenge') or has('gcAssist') or has('markroot'):
        c='GC (mark workers, assists, sweep, scavenge)'
    elif has('runtime.mcall') or has('runtime.schedule') or has('findRunnable') or has('runtime.park_m') or has('runtime.goexit0'):
        if has('findRunnable') or has('stealWork') or has('netpoll'):
            c='scheduler: findRunnable (netpoll, steal, spin, stopm)'
        else: c='scheduler: other (park/schedule/execute)'
    elif has('runtime.sysmon'):
        c='sysmon'
    elif has('observe.') and has('Handler).observe'):
        c='Sluice: observe (metrics, access log)'
    elif has('h1up.'):
        c='h1up (upstream client)'
    elif has('listen.(*h1Conn).readRequest') or has('net/http.readRequest') or has('h1Conn).readHead') or has('listen.readRequest'):
        c='own h1 server: read/parse request'
    elif has('listen.(*h1Conn).finish') or has('h1resp') or has('listen.(*h1Response)') or has('listen.(*h1Writer)'):
        c='own h1 server: response write (finish/h1resp)'
    elif has('proxy.(*Handler)'):
        c='Sluice: pipeline other'
    elif has('listen.'):
        c='own h1 server: other'
    elif has('runtime.newproc') or has('runtime.malg'):
        c='runtime: goroutine creation'
    else:
        c='other: '+ ' < '.join(frames[:3])[:120]
    cats[c]+=v
    if issys: sysc[c]+=v
print("total ms", round(tot,1))
for c,v in cats.most_common(30):
    print("%6.1f%%  %7.1f ms  (sys %4.1f%%)  %s"%(100*v/tot,v,100*sysc[c]/tot,c))
print("syscall-ish leaf total %.1f%%"%(100*sum(sysc.values())/tot))
