// oneDNN's convolution as three XLA FFI handlers for the CPU: the forward pass, the input gradient
// ("backward data") and the kernel gradient ("backward weights") of PyTorch's conv2d without bias.
//
// Layouts: activations NHWC (what the project's layers hold), weights OIHW (PyTorch's Conv2d layout).
// float32 only; the Python side (functional_gan/onednn) sends everything else to XLA's own convolution.
// A transposed convolution is the input gradient of the convolution with the same weight, so these three
// handlers serve both, and each one's derivatives are the other two (see functional_gan/onednn/__init__.py).
//
// Primitives are created once per shape and kept (oneDNN primitives are reusable and thread-safe to execute);
// XLA may call a handler from several of its threads at once, so each call has its own stream and scratchpad.
// oneDNN runs on OpenMP here (the onednn-cpu-gomp wheel): each calling thread starts its own team, of
// fg_onednn_set_threads(n) threads (default: OpenMP's own, the cores the process may use). With
// fg_onednn_set_serial(1) the calls take turns, so that at most one team is busy at any time.

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#define FG_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

enum Op : int { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

// One convolution's geometry: x (N, H, W, C) convolved with w (O, C, KH, KW) gives y (N, OH, OW, O).
struct Geometry {
  int64_t n, c, h, w, o, oh, ow, kh, kw, stride, pad_l, pad_r_h, pad_r_w;
  auto key(int op, int team) const {
    return std::make_tuple(op, team, n, c, h, w, o, oh, ow, kh, kw, stride, pad_l, pad_r_h, pad_r_w);
  }
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Cached {
  dnnl::primitive primitive;
  memory::desc weights;  // the weights as the primitive wants them (its own blocked layout, maybe)
  memory::desc scratchpad;
  bool reorder = false;  // whether that layout differs from PyTorch's OIHW
  dnnl::reorder to_primitive, from_primitive;  // OIHW -> its layout (forward, backward data) and back (weights)
};

std::mutex cache_mutex;
std::map<decltype(std::declval<Geometry>().key(0, 0)), std::shared_ptr<Cached>> cache;
std::mutex serial_mutex;
int serial = 0;
int threads = 0;  // 0: OpenMP's default

// OpenMP's own functions, from the libgomp.so.1 that libdnnl.so.3 brought in (loaded locally, so asked by handle).
void* openmp_function(const char* name) {
  static void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  return gomp ? dlsym(gomp, name) : nullptr;
}

using SetThreads = void (*)(int);
SetThreads omp_set_num_threads_fn() {
  static SetThreads fn = reinterpret_cast<SetThreads>(openmp_function("omp_set_num_threads"));
  return fn;
}

memory::desc activations(int64_t n, int64_t c, int64_t h, int64_t w) {
  return memory::desc({n, c, h, w}, dt::f32, tag::nhwc);
}

dnnl::primitive_attr user_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// What every primitive of a geometry is described by: the activations as given (NHWC), the kernel in a layout of
// oneDNN's choosing, the strides and the padding before and after the image.
struct Descriptors {
  memory::desc src, weights, dst;
  memory::dims strides, pad_l, pad_r;
  explicit Descriptors(const Geometry& g)
      : src(activations(g.n, g.c, g.h, g.w)), weights({g.o, g.c, g.kh, g.kw}, dt::f32, tag::any),
        dst(activations(g.n, g.o, g.oh, g.ow)), strides{g.stride, g.stride}, pad_l{g.pad_l, g.pad_l},
        pad_r{g.pad_r_h, g.pad_r_w} {}
};

dnnl::convolution_forward::primitive_desc forward_pd(const Descriptors& d) {
  return dnnl::convolution_forward::primitive_desc(
      engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.src, d.weights, d.dst,
      d.strides, d.pad_l, d.pad_r, user_attr());
}

// oneDNN sizes a primitive's OpenMP team when it creates it (and asks for that team by number at every call):
// the cache holds one primitive per shape and team size.
std::shared_ptr<Cached> primitive_for(int op, const Geometry& g) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  int team = threads;
  auto found = cache.find(g.key(op, team));
  if (found != cache.end()) return found->second;
  auto entry = std::make_shared<Cached>();
  Descriptors d(g);
  auto fwd = forward_pd(d);
  if (op == kForward) {
    entry->primitive = dnnl::convolution_forward(fwd);
    entry->weights = fwd.weights_desc();
    entry->scratchpad = fwd.scratchpad_desc();
  } else if (op == kBackwardData) {
    dnnl::convolution_backward_data::primitive_desc pd(engine(), dnnl::algorithm::convolution_direct, d.src,
                                                       d.weights, d.dst, d.strides, d.pad_l, d.pad_r, fwd,
                                                       user_attr());
    entry->primitive = dnnl::convolution_backward_data(pd);
    entry->weights = pd.weights_desc();
    entry->scratchpad = pd.scratchpad_desc();
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(engine(), dnnl::algorithm::convolution_direct, d.src,
                                                          d.weights, d.dst, d.strides, d.pad_l, d.pad_r, fwd,
                                                          user_attr());
    entry->primitive = dnnl::convolution_backward_weights(pd);
    entry->weights = pd.diff_weights_desc();
    entry->scratchpad = pd.scratchpad_desc();
  }
  memory::desc plain({g.o, g.c, g.kh, g.kw}, dt::f32, tag::oihw);
  entry->reorder = entry->weights != plain;
  if (entry->reorder && op == kBackwardWeights)
    entry->from_primitive = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), entry->weights, engine(), plain));
  else if (entry->reorder)
    entry->to_primitive = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain, engine(), entry->weights));
  cache.emplace(g.key(op, team), entry);
  return entry;
}

// The geometry of a convolution from its input (N, H, W, C), kernel (O, C, KH, KW) and output (N, OH, OW, O) dims;
// the padding after the image follows from them (PyTorch's floor: it may be less than pad_l).
ffi::Error geometry(ffi::Span<const int64_t> x, ffi::Span<const int64_t> w, ffi::Span<const int64_t> y,
                    int64_t stride, int64_t pad, Geometry& g) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4)
    return ffi::Error::InvalidArgument("oneDNN convolution: arrays must be 4-D (NHWC activations, OIHW kernel)");
  g = Geometry{x[0], x[3], x[1], x[2], w[0], y[1], y[2], w[2], w[3], stride, pad, 0, 0};
  g.pad_r_h = (g.oh - 1) * stride + g.kh - g.h - pad;
  g.pad_r_w = (g.ow - 1) * stride + g.kw - g.w - pad;
  if (w[1] != g.c || y[0] != g.n || y[3] != g.o || stride < 1 || pad < 0 || g.pad_r_h < 0 || g.pad_r_w < 0)
    return ffi::Error::InvalidArgument("oneDNN convolution: shapes, stride and padding do not fit together");
  return ffi::Error::Success();
}

ffi::Error run(int op, const Geometry& g, float* x, float* w, float* y) {
  try {
    if (threads > 0 && omp_set_num_threads_fn()) omp_set_num_threads_fn()(threads);
    auto entry = primitive_for(op, g);
    auto& eng = engine();
    memory user_weights({{g.o, g.c, g.kh, g.kw}, dt::f32, tag::oihw}, eng, w);
    memory x_mem(activations(g.n, g.c, g.h, g.w), eng, x);
    memory y_mem(activations(g.n, g.o, g.oh, g.ow), eng, y);
    thread_local std::vector<char> scratch, blocked;  // this thread's: XLA may run calls on several at once
    if (scratch.size() < entry->scratchpad.get_size()) scratch.resize(entry->scratchpad.get_size());
    memory scratch_mem(entry->scratchpad, eng, scratch.data());
    if (entry->reorder && blocked.size() < entry->weights.get_size()) blocked.resize(entry->weights.get_size());
    memory weights = entry->reorder ? memory(entry->weights, eng, blocked.data()) : user_weights;
    std::unique_lock<std::mutex> turn(serial_mutex, std::defer_lock);
    if (serial) turn.lock();
    dnnl::stream stream(eng);
    if (op == kForward) {
      if (entry->reorder) entry->to_primitive.execute(stream, user_weights, weights);
      entry->primitive.execute(stream, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, y_mem},
                                        {DNNL_ARG_SCRATCHPAD, scratch_mem}});
    } else if (op == kBackwardData) {  // x is dx (written), y is dy (read)
      if (entry->reorder) entry->to_primitive.execute(stream, user_weights, weights);
      entry->primitive.execute(stream, {{DNNL_ARG_DIFF_SRC, x_mem}, {DNNL_ARG_WEIGHTS, weights},
                                        {DNNL_ARG_DIFF_DST, y_mem}, {DNNL_ARG_SCRATCHPAD, scratch_mem}});
    } else {  // w is dw (written)
      entry->primitive.execute(stream, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_DIFF_WEIGHTS, weights},
                                        {DNNL_ARG_DIFF_DST, y_mem}, {DNNL_ARG_SCRATCHPAD, scratch_mem}});
      if (entry->reorder) entry->from_primitive.execute(stream, weights, user_weights);
    }
    stream.wait();
    return ffi::Error::Success();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("oneDNN: ") + e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("oneDNN convolution: ") + e.what());
  }
}

using F32 = ffi::Buffer<ffi::F32>;
using F32Out = ffi::ResultBuffer<ffi::F32>;

ffi::Error Forward(F32 x, F32 w, F32Out y, int64_t stride, int64_t padding) {
  Geometry g;
  ffi::Error error = geometry(x.dimensions(), w.dimensions(), y->dimensions(), stride, padding, g);
  if (!error.success()) return error;
  return run(kForward, g, x.typed_data(), w.typed_data(), y->typed_data());
}

ffi::Error BackwardData(F32 dy, F32 w, F32Out dx, int64_t stride, int64_t padding) {
  Geometry g;
  ffi::Error error = geometry(dx->dimensions(), w.dimensions(), dy.dimensions(), stride, padding, g);
  if (!error.success()) return error;
  return run(kBackwardData, g, dx->typed_data(), w.typed_data(), dy.typed_data());
}

ffi::Error BackwardWeights(F32 x, F32 dy, F32Out dw, int64_t stride, int64_t padding) {
  Geometry g;
  ffi::Error error = geometry(x.dimensions(), dw->dimensions(), dy.dimensions(), stride, padding, g);
  if (!error.success()) return error;
  return run(kBackwardWeights, g, x.typed_data(), dw->typed_data(), dy.typed_data());
}

}  // namespace

#define FG_BIND \
  ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<ffi::Buffer<ffi::F32>>().Attr<int64_t>("stride").Attr<int64_t>("padding")

// The macro gives the handlers no visibility of its own: declared exported first.
FG_EXPORT XLA_FFI_Error* fg_onednn_conv_forward(XLA_FFI_CallFrame*);
FG_EXPORT XLA_FFI_Error* fg_onednn_conv_backward_data(XLA_FFI_CallFrame*);
FG_EXPORT XLA_FFI_Error* fg_onednn_conv_backward_weights(XLA_FFI_CallFrame*);

XLA_FFI_DEFINE_HANDLER_SYMBOL(fg_onednn_conv_forward, Forward, FG_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(fg_onednn_conv_backward_data, BackwardData, FG_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(fg_onednn_conv_backward_weights, BackwardWeights, FG_BIND);

FG_EXPORT void fg_onednn_set_threads(int n) { threads = n; }
FG_EXPORT void fg_onednn_set_serial(int on) { serial = on; }
// The OpenMP team a call from this thread would start now (-1 where OpenMP's functions were not found).
FG_EXPORT int fg_onednn_team_size() {
  using GetMax = int (*)();
  static GetMax fn = reinterpret_cast<GetMax>(openmp_function("omp_get_max_threads"));
  if (!fn) return -1;
  if (threads > 0 && omp_set_num_threads_fn()) omp_set_num_threads_fn()(threads);
  return fn();
}
FG_EXPORT int fg_onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return v->major * 10000 + v->minor * 100 + v->patch;
}
