"""The rowwise launch estimate counts only HBM row inputs as bytes in flight."""

from napkin.codegen.families.rowwise import FAMILY
from napkin.diagrams import library


def test_broadcast_inputs_are_not_bytes_in_flight():
    # layernorm reads X[r,x] from HBM per row; gamma[x], beta[x] are broadcast (L2): same
    # in-flight bytes per thread as softmax, which reads only X
    ln = library.get("layernorm").bind(r=4096, x=4096)
    sm = library.get("softmax").bind(r=4096, x=4096)
    s_ln = FAMILY.candidates(ln, "h200", "bf16")[0]
    s_sm = FAMILY.candidates(sm, "h200", "bf16")[0]
    e_ln = FAMILY.launch_estimate(ln, s_ln, "h200")
    e_sm = FAMILY.launch_estimate(sm, s_sm, "h200")
    assert e_ln["threads"] == e_sm["threads"]
    assert e_ln["in_flight_bytes_per_thread"] == e_sm["in_flight_bytes_per_thread"]
