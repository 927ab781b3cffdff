"""torch.nn equivalents of downpour's models, their parameters named as
`train --save` names them (layers.{i}.weight / .bias, docs/models.md,
"Checkpoints and PyTorch"), so a checkpoint loads with
load_state_dict(strict=True).  Used by downpour.to_torch and by
tests/test_torch_interop.py.  Needs PyTorch (Debian: python3-torch)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    """A stack of dense layers as a spec of widths, input first
    (784-300-100-10: mlp-300-100): relu between, logits out."""

    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(widths, widths[1:])])

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class MlpBn(nn.Module):
    """mlp-bn: 784-dense300-bn-relu-dense100-bn-relu-10."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 300), nn.BatchNorm1d(300),
                                     nn.Linear(300, 100), nn.BatchNorm1d(100),
                                     nn.Linear(100, 10)])

    def forward(self, x):
        d1, b1, d2, b2, d3 = self.layers
        x = F.relu(b1(d1(x.flatten(1))))
        return d3(F.relu(b2(d2(x))))


class ConvBn(nn.Module):
    """1x28x28-conv5x5x8s2-bn-relu-maxpool2-dense32-bn-relu-4."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, 8, 5, stride=2), nn.BatchNorm2d(8),
                                     nn.Linear(8 * 6 * 6, 32), nn.BatchNorm1d(32),
                                     nn.Linear(32, 4)])

    def forward(self, x):
        c1, b1, d2, b2, d3 = self.layers
        x = F.max_pool2d(F.relu(b1(c1(x))), 2)
        return d3(F.relu(b2(d2(x.flatten(1)))))


class CnnMnist(nn.Module):
    """1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-<classes>."""

    def __init__(self, classes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5),
                                     nn.Linear(1024, 128), nn.Linear(128, classes)])

    def forward(self, x):
        c1, c2, d1, d2 = self.layers
        x = F.max_pool2d(F.relu(c1(x)), 2)
        x = F.max_pool2d(F.relu(c2(x)), 2)
        return d2(F.relu(d1(x.flatten(1))))


class Local2d(nn.Module):
    """Locally connected: weight (oh, ow, oc, c, kh, kw), bias (oh, ow, oc)."""

    def __init__(self, c, oc, k, stride, out_hw):
        super().__init__()
        self.k, self.stride = k, stride
        self.weight = nn.Parameter(torch.zeros(out_hw, out_hw, oc, c, k, k))
        self.bias = nn.Parameter(torch.zeros(out_hw, out_hw, oc))

    def forward(self, x):
        oh, ow, oc = self.bias.shape
        cols = F.unfold(x, self.k, stride=self.stride)        # (b, c*k*k, oh*ow)
        w = self.weight.reshape(oh * ow, oc, -1)               # (p, oc, c*k*k)
        y = torch.einsum("bkp,pok->bop", cols, w) + self.bias.reshape(oh * ow, oc).t()
        return y.reshape(x.shape[0], oc, oh, ow)


class LocalNet(nn.Module):
    """1x28x28-local5x5x4s2-relu-conv3x3x8p1-relu-avgpool2-4."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Local2d(1, 4, 5, 2, 12), nn.Conv2d(4, 8, 3, padding=1),
                                     nn.Linear(8 * 6 * 6, 4)])

    def forward(self, x):
        l1, c2, d3 = self.layers
        x = F.relu(l1(x))
        x = F.avg_pool2d(F.relu(c2(x)), 2)
        return d3(x.flatten(1))


def conv_then_bn(c_in, c_out, k, stride):
    """A conv then a bn, as the spec's conv...-bn (padding k // 2)."""
    return [nn.Conv2d(c_in, c_out, k, stride, padding=k // 2), nn.BatchNorm2d(c_out)]


class ResnetFashion(nn.Module):
    """resnet-fashion (docs/models.md): parameter layers layers.{i} in spec
    order, a block's main branch (conv, bn, conv, bn) then its projection
    shortcut's (conv, bn)."""

    def __init__(self):
        super().__init__()
        layers, self.blocks = conv_then_bn(1, 16, 3, 1), []
        c_in = 16
        for c, stride in [(16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)]:
            first = len(layers)
            layers += conv_then_bn(c_in, c, 3, stride) + conv_then_bn(c, c, 3, 1)
            if stride != 1:
                layers += conv_then_bn(c_in, c, 1, stride)
            self.blocks.append((first, stride != 1))
            c_in = c
        self.layers = nn.ModuleList(layers + [nn.Linear(64, 10)])

    def forward(self, x):
        L = self.layers
        x = F.relu(L[1](L[0](x)))
        for i, proj in self.blocks:
            y = L[i + 3](L[i + 2](F.relu(L[i + 1](L[i](x)))))
            x = F.relu(y + (L[i + 5](L[i + 4](x)) if proj else x))
        return L[-1](x.mean((2, 3)))


class PosEmbedding(nn.Module):
    """pos: a learned (1, T, D) added to the tokens."""

    def __init__(self, T, D):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.zeros(1, T, D))

    def forward(self, t):
        return t + self.pos_embedding


class VitMnist(nn.Module):
    """vit-mnist (docs/models.md): patches by a strided conv, positions, two
    pre-norm blocks (ln, mha4, residual; ln, 1x1 conv 128, gelu, 1x1 conv 64,
    residual), ln, the mean over tokens, dense 10; tokens in NHWC order."""

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(1, 64, 7, stride=7), PosEmbedding(16, 64)]
        for _ in range(2):
            layers += [nn.LayerNorm(64), nn.MultiheadAttention(64, 4, batch_first=True),
                       nn.LayerNorm(64), nn.Conv2d(64, 128, 1), nn.Conv2d(128, 64, 1)]
        self.layers = nn.ModuleList(layers + [nn.LayerNorm(64), nn.Linear(64, 10)])

    def forward(self, x):
        L = self.layers
        t = L[1](L[0](x).flatten(2).transpose(1, 2))       # (batch, 16, 64)
        for i in (2, 7):
            h = L[i](t)
            t = t + L[i + 1](h, h, h, need_weights=False)[0]
            h = L[i + 2](t).transpose(1, 2).reshape(-1, 64, 4, 4)
            h = L[i + 4](F.gelu(L[i + 3](h)))
            t = t + h.flatten(2).transpose(1, 2)
        return L[13](L[12](t).mean(1))


CNN_MNIST = "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-"


def module_for(spec, name=None):
    """The torch.nn module for a model spec (or preset name): dense stacks
    (mlp-300-100, mlp-128, any 784-...-10), cnn-mnist (any class count),
    mlp-bn, resnet-fashion and vit-mnist.  ValueError for another spec."""
    presets = {"mlp-300-100": "784-300-100-10", "mlp-128": "784-128-10",
               "cnn-mnist": CNN_MNIST + "10"}
    spec = presets.get(spec, spec)
    if name in ("mlp-bn",) or spec == "mlp-bn":
        return MlpBn()
    if name == "resnet-fashion" or spec == "resnet-fashion":
        return ResnetFashion()
    if name == "vit-mnist" or spec == "vit-mnist":
        return VitMnist()
    parts = spec.split("-")
    if all(p.isdigit() for p in parts) and len(parts) >= 2:
        return Mlp([int(p) for p in parts])
    if spec.startswith(CNN_MNIST) and spec[len(CNN_MNIST):].isdigit():
        return CnnMnist(int(spec[len(CNN_MNIST):]))
    raise ValueError(f"model {spec}: no torch.nn equivalent in downpour.nets yet (dense "
                     f"stacks, cnn-mnist, mlp-bn, resnet-fashion and vit-mnist have one)")
