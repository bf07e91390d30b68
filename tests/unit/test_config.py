"""Configs: one place for a field, its default, its TOML key and its flag."""

import attrs
import pytest

from dgr.cli import build_parser, configs_from_args
from dgr.config import NodeConfig, ServerConfig, load_configs


@pytest.mark.parametrize("cls", [NodeConfig, ServerConfig])
def test_every_field_has_a_flag_whose_help_shows_its_default(cls):
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    by_dest = {action.dest: action for action in run._actions}
    for field in attrs.fields(cls):
        action = by_dest[field.name]
        assert action.option_strings[0] == field.metadata["flag"]
        shown = field.metadata["default_text"] or field.default
        assert action.help.endswith(f"(default: {shown})".replace("%", "%%"))


def test_toml_data_and_flags_load_through_one_path(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('max_running = 4\nn_ctx = 8192\n[server]\nport = 9000\ngrace_s = 5\n')
    args = build_parser().parse_args(["run", "--config", str(toml), "--max-running", "2",
                                      "--host", "0.0.0.0", "--no-kv-unified"])
    node, server = configs_from_args(args)
    assert (node.max_running, node.n_ctx, node.kv_unified) == (2, 8192, False)  # flags win
    assert (server.port, server.grace_s, server.host) == (9000, 5.0, "0.0.0.0")


@pytest.mark.parametrize("data,message", [
    ({"max_runing": 4}, "unknown config keys: max_runing"),
    ({"server": {"prot": 1}}, "unknown [server] keys: prot"),
    ({"server": {"port": 70000}}, "port must be within"),
    ({"max_running": "many"}, "invalid literal"),
    ({"speculation": "fast"}, "speculation must be one of off, auto, always"),
])
def test_bad_config_data_is_a_clear_error(data, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_configs(data)


def test_the_prefill_chunk_fits_a_small_step_unless_given():
    # a node started with a small --batch needs no --prefill-chunk of its own
    small = configs_from_args(build_parser().parse_args(
        ["run", "--batch", "32", "--ubatch", "32", "--max-running", "2"]))[0]
    assert small.prefill_chunk == 32
    assert NodeConfig().prefill_chunk == 256
    with pytest.raises(ValueError, match=r"prefill_chunk \(64\) exceeds the step token budget"):
        NodeConfig(n_batch=32, n_ubatch=32, max_running=2, prefill_chunk=64)


def test_adapter_flags_repeat_in_dgr_and_llama_servers_forms(tmp_path):
    from dgr.adapters import AdapterFile, adapter_files

    args = build_parser().parse_args(["run", "--lora", "sql=/m/sql.gguf:0.5", "--lora",
                                      "/m/chat.gguf", "--lora-scaled", "/m/x.gguf", "0.25",
                                      "--max-loras", "4"])
    node = configs_from_args(args)[0]
    assert node.lora == ("sql=/m/sql.gguf:0.5", "/m/chat.gguf")
    assert node.lora_scaled == (("/m/x.gguf", "0.25"),)
    assert adapter_files(node) == [AdapterFile("sql", "/m/sql.gguf", 0.5, 0.0),
                                   AdapterFile("chat", "/m/chat.gguf", 1.0, 1.0),
                                   AdapterFile("x", "/m/x.gguf", 0.25, 0.25)]
    toml = tmp_path / "node.toml"
    toml.write_text('lora = ["a=/m/a.gguf"]\nlora_scaled = [["/m/b.gguf", 0.5]]\n')
    node = configs_from_args(build_parser().parse_args(["run", "--config", str(toml)]))[0]
    assert (node.lora, node.lora_scaled) == (("a=/m/a.gguf",), (("/m/b.gguf", "0.5"),))
    with pytest.raises(ValueError, match="max_loras"):
        NodeConfig(max_loras=65)


def test_known_adapter_flags_take_vllms_forms(tmp_path):
    args = build_parser().parse_args([
        "run", "--lora-dir", str(tmp_path), "--lora-modules", "a=/m/a.gguf",
        '{"name": "b", "path": "/m/b.gguf"}', "--lora-modules", "c=/m/c.gguf",
        "--lora-wait", "2.5"])
    node = configs_from_args(args)[0]
    assert node.lora_modules == ("a=/m/a.gguf", '{"name": "b", "path": "/m/b.gguf"}',
                                 "c=/m/c.gguf")
    assert (node.lora_dir, node.lora_wait_s) == (str(tmp_path), 2.5)
    toml = tmp_path / "node.toml"
    toml.write_text('lora_modules = ["a=/m/a.gguf"]\nlora_wait_s = 0\n')
    node = configs_from_args(build_parser().parse_args(["run", "--config", str(toml)]))[0]
    assert (node.lora_modules, node.lora_wait_s) == (("a=/m/a.gguf",), 0.0)
    with pytest.raises(ValueError, match="lora_wait_s"):
        NodeConfig(lora_wait_s=-1)
