"""Graph pictures: the stop_gradient cut is marked, G's side of the D step is cut."""

import jax

from functional_gan import graph
from functional_gan.lessons import pictures
from functional_gan.main import main


def test_gradient_flow_stops_at_stop_gradient():
    closed = jax.make_jaxpr(lambda x, y: (10.0 - jax.lax.stop_gradient(2 * x + 3)) * y)(5.0, 2.0)
    live_eqns, live_inputs = graph.gradient_flow(closed.jaxpr)
    primitives = [eqn.primitive.name for eqn in closed.jaxpr.eqns]
    assert live_inputs == {1}, "only y receives a gradient"
    assert primitives == ["mul", "add", "stop_gradient", "sub", "mul"]
    assert live_eqns == {3, 4}, "2·x and +3 lie upstream of the cut; stop_gradient itself passes nothing"


def test_d_step_graph_cuts_every_generator_input():
    graphs = pictures.d_step_graphs()
    dot = graphs["dstep_jax_loss"]
    g_inputs = [line for line in dot.splitlines() if 'label="G ' in line]
    d_inputs = [line for line in dot.splitlines() if 'label="D ' in line]
    assert g_inputs and all("no gradient" in line for line in g_inputs)
    assert d_inputs and not any("no gradient" in line for line in d_inputs)
    assert "stop_gradient\\n(cut)" in dot and 'label="✂"' in dot
    torch_dot = graphs["dstep_torch_loss"]
    assert "netD.main.0.weight" in torch_dot and "netG." not in torch_dot  # detach(): no G node in PyTorch's graph


def test_cli_writes_dot_files(tmp_path, capsys):
    assert main(["graph", "detach", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "detach_jax_loss.dot").read_text().startswith("digraph")
    assert (tmp_path / "detach_torch_loss.dot").exists()


def test_idiom_graphs_mark_each_cut_and_the_penalty_as_a_gradient_of_a_gradient():
    graphs = pictures.idiom_graphs()

    def inputs(dot):
        return {line.split('label="')[1].split("\\n")[0]: "no gradient" in line for line in dot.splitlines() if "[shape=box" in line and line.strip().startswith("in")}

    assert inputs(graphs["target_network_jax"]) == {"online": False, "target": True}  # the TD target is a label
    assert inputs(graphs["straight_through_jax"]) == {"x (encoder output)": False}  # cut, yet x still gets the gradient
    assert inputs(graphs["tbptt_jax"]) == {"W": False, "U": False} and "stop_gradient\\n(cut)" in graphs["tbptt_jax"]
    assert graphs["simsiam_jax"].count("stop_gradient\\n(cut)") == 2  # one per branch of the symmetric loss
    # No target node in PyTorch's graph: the TD target was computed under no_grad.
    assert "online" in graphs["target_network_torch"] and 'label="target' not in graphs["target_network_torch"]
    # The penalty's graph records backward nodes (create_graph=True); JAX's holds the conv's VJP as a function.
    assert "ConvolutionBackwardBackward0" in graphs["gradient_penalty_torch"]
    assert "custom_vjp_call[_conv_transpose2d]" in graphs["gradient_penalty_jax"]
