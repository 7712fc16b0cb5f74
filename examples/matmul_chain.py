"""Long chains of matmuls, for the planner's speed: ``napkin derive examples/matmul_chain.py:chain200``.

Y = X·W0·W1·…·W(n−1): n contractions, each its own kernel (nothing fuses two contractions), so
the plan has n kernels. The planner analyses each run of boxes once, and refuses runs of two
contractions structurally, before anything is costed.
"""

from napkin.diagrams import Axis, Diagram, array, contract


def chain(n: int, width: int = 512, tokens: int = 1024) -> Diagram:
    """``n`` matmuls in a row: X[t, a0] · W0[a0, a1] · … · W(n−1)[a(n−1), an]."""
    t = Axis("t", tokens)
    ax = [Axis(f"a{i}", width) for i in range(n + 1)]
    cur = array("X", t, ax[0])
    inputs = [cur]
    for i in range(n):
        w = array(f"W{i}", ax[i], ax[i + 1])
        inputs.append(w)
        cur = contract(cur, w, over=ax[i].name, name=f"Y{i}")
    return Diagram(f"chain{n}", cur, inputs, description=f"{n} matmuls in a row")


def chain40() -> Diagram:
    return chain(40)


def chain200() -> Diagram:
    return chain(200)
