from llamapy.gguf import GGUFReader


def test_models_open(smollm2_path, gemma3_path):
    for p, arch in ((smollm2_path, "llama"), (gemma3_path, "gemma3")):
        r = GGUFReader(p)
        assert r.get("general.architecture") == arch
        assert r.tensors
