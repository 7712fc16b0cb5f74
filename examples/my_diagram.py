"""Diagrams of your own: build them with napkin's builder API and name them on the command line.

    napkin show examples/my_diagram.py:swiglu -s a=4096 -s b=4096 -s f=11008
    napkin render examples/my_diagram.py:linear_attention -o linear_attention.svg

Any module-level Diagram (or a function with no arguments that returns one) can be
named after the colon. Axes with the same name are the same wire, so their sizes
must agree wherever they appear.
"""

from napkin.diagrams import Diagram, array, axes, contract, relu, silu, sum_over

# --------------------------------------------------------------------------- SwiGLU MLP
# Y[a,b] = Σ_f (silu(X·Wgᵀ) ⊙ X·Wuᵀ)[a,f] · Wd[b,f]   (the feed-forward block of LLaMA-style models)
a, b, f = axes("a b f")  # tokens, model width, hidden width
X = array("X", a, b)
Wg, Wu = array("Wg", f, b), array("Wu", f, b)  # gate and up projections, stored as nn.Linear weights
Wd = array("Wd", b, f)  # down projection

G = silu(contract(X, Wg, over=b, out=(a, f), name="G_lin"), name="G")
U = contract(X, Wu, over=b, out=(a, f), name="U")
H = (G * U).named("H")
Y = contract(H, Wd, over=f, out=(a, b), name="Y")
swiglu = Diagram("swiglu", Y, description="SwiGLU feed-forward: (silu(X·Wg) ⊙ X·Wu)·Wd")


# --------------------------------------------------------------------------- linear attention
# Softmax-free attention with the positive feature map φ(t) = 1 + relu(t):
#   O[q,e] = Σ_d φ(Q)[q,d]·KV[d,e] / Σ_d φ(Q)[q,d]·k[d],  KV = Σ_x φ(K)[x,d]·V[x,e],  k = Σ_x φ(K)[x,d]
# Keys and values are summed once, so the cost is linear in the sequence length.
def linear_attention() -> Diagram:
    q, x, d, e = axes("q x d e")
    Q, K, V = array("Q", q, d), array("K", x, d), array("V", x, e)
    Qf = (relu(Q) + 1.0).named("Qf")
    Kf = (relu(K) + 1.0).named("Kf")
    KV = contract(Kf, V, over=x, name="KV")  # [d,e]
    ksum = sum_over(Kf, over=x, name="ksum")  # [d]
    num = contract(Qf, KV, over=d, name="num")  # [q,e]
    den = contract(Qf, ksum, over=d, name="den")  # [q]
    return Diagram("linear_attention", (num / den).named("O"), description="softmax-free linear attention")
