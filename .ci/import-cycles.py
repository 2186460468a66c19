"""No two modules of the published crates import each other, directly or in
a loop: each file's `crate::…` / `super::…` paths are resolved to the file
that defines the module, and any cycle among those files is an error.
(Comments and `mod tests` are left out; `mod x;` declarations are not
imports.) Run from the repository root: python3 .ci/import-cycles.py"""
import os, re, collections, sys
def modpath(crate_src, f):
    rel=os.path.relpath(f, crate_src)[:-3]
    parts=rel.split('/')
    if parts[-1] in ('mod','lib','main'): parts=parts[:-1]
    return parts
edges=collections.defaultdict(dict)
for crate in ['sdk','middleware','collector']:
    src=f'{crate}/src'
    files=[os.path.join(d,f) for d,_,fs in os.walk(src) for f in fs if f.endswith('.rs')]
    mods={tuple(modpath(src,f)):f for f in files}
    for f in files:
        me=modpath(src,f)
        lines=[l for l in open(f).read().split('\n') if not l.strip().startswith('//')]
        txt='\n'.join(lines)
        txt=re.split(r'#\[cfg\(test\)\]\s*mod tests', txt)[0]
        for m in re.finditer(r'\b((?:crate|super)(?:::(?:super|\w+))+)', txt):
            segs=m.group(1).split('::')
            if segs[0]=='crate': target=segs[1:]
            else:
                cur=me[:] if os.path.basename(f) in ('mod.rs','lib.rs') else me[:]
                # `super` from file a/b.rs (module a::b) refers to a
                cur=me[:]
                i=0
                while i<len(segs) and segs[i]=='super':
                    cur=cur[:-1]; i+=1
                target=cur+segs[i:]
            for i in range(len(target),0,-1):
                t=tuple(target[:i])
                if t in mods:
                    if mods[t]!=f: edges[f].setdefault(mods[t], m.group(1))
                    break
cyc=[]
for a in edges:
    for b in edges[a]:
        if a in edges.get(b,{}) and a<b:
            cyc.append((a,b, edges[a][b], edges[b][a]))
# strongly connected components (Tarjan)
sys.setrecursionlimit(10000)
index={}; low={}; stack=[]; on=set(); sccs=[]; c=[0]
def strong(v):
    index[v]=low[v]=c[0]; c[0]+=1; stack.append(v); on.add(v)
    for w in edges.get(v,{}):
        if w not in index:
            strong(w); low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        comp=[]
        while True:
            w=stack.pop(); on.discard(w); comp.append(w)
            if w==v: break
        if len(comp)>1: sccs.append(comp)
for v in list(edges):
    if v not in index: strong(v)
for comp in sccs:
    print("import cycle among: " + ", ".join(sorted(comp)), file=sys.stderr)
sys.exit(1 if sccs else 0)
