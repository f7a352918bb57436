#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace pipesim::cuda_test {

using runtime::cuda::bf16_bits_to_float;
using runtime::cuda::dtype_name;
using runtime::cuda::element_size;
using runtime::cuda::float_to_bf16_bits;

void Report::add(Check check) {
  std::printf("%-26s %-30s %-5s %-12s %10.2e %8zu %9zu\n", check.kernel.c_str(), check.shape.c_str(),
              check.dtype.c_str(), check.tensor.c_str(), check.max_error, check.wrong, check.elements);
  std::fflush(stdout);
  checks_.push_back(std::move(check));
}

void Report::compare(const std::string& kernel, const std::string& shape, DType dtype, const std::string& tensor,
                     std::span<const float> got, std::span<const float> want, double tol) {
  Check check{kernel, shape, std::string(dtype_name(dtype)), tensor, 0, 0, want.size()};
  double squares = 0;
  std::size_t finite = 0;
  for (const float w : want)
    if (std::isfinite(w)) squares += double(w) * w, ++finite;
  const double rms = finite == 0 ? 0 : std::sqrt(squares / double(finite));
  if (got.size() != want.size()) check.wrong = std::max(got.size(), want.size());
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double scale = std::abs(double(want[i])) + rms;
    const double error = std::abs(double(got[i]) - double(want[i]));
    // Equal values (infinities included: an empty shard's max is −∞) are exact.
    const double relative = got[i] == want[i] ? 0 : scale > 0 ? error / scale : error;
    // NaN in either compares false below: count it wrong explicitly.
    if (!(relative <= tol)) ++check.wrong;
    if (!(relative <= check.max_error)) check.max_error = std::isnan(relative) ? INFINITY : relative;
  }
  add(std::move(check));
}

void Report::compare_bits(const std::string& kernel, const std::string& shape, DType dtype, const std::string& tensor,
                          std::span<const float> got, std::span<const float> want) {
  Check check{kernel, shape, std::string(dtype_name(dtype)), tensor, 0, 0, want.size()};
  if (got.size() != want.size()) check.wrong = std::max(got.size(), want.size());
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++check.wrong;
  add(std::move(check));
}

std::size_t Report::total_wrong() const {
  std::size_t wrong = 0;
  for (const Check& c : checks_) wrong += c.wrong;
  return wrong;
}

Tensor::Tensor(std::span<const float> host, DType dtype)
    : bytes_(host.size() * element_size(dtype)), dtype_(dtype), count_(host.size()) {
  std::vector<std::byte> raw(host.size() * element_size(dtype));
  if (dtype == DType::F32) {
    std::memcpy(raw.data(), host.data(), raw.size());
  } else {
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::uint16_t bits = float_to_bf16_bits(host[i]);
      std::memcpy(raw.data() + 2 * i, &bits, 2);
    }
  }
  bytes_.upload(raw);
}

std::vector<float> Tensor::download() const {
  const std::vector<std::byte> raw = bytes_.download();
  std::vector<float> host(count_);
  if (dtype_ == DType::F32) {
    std::memcpy(host.data(), raw.data(), raw.size());
  } else {
    for (std::size_t i = 0; i < count_; ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, raw.data() + 2 * i, 2);
      host[i] = bf16_bits_to_float(bits);
    }
  }
  return host;
}

Stream::Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
Stream::~Stream() { static_cast<void>(cudaStreamDestroy(stream_)); }
void Stream::sync() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::vector<float> rounded(std::vector<float> values, DType dtype) {
  if (dtype == DType::BF16)
    for (float& v : values) v = bf16_bits_to_float(float_to_bf16_bits(v));
  return values;
}

std::vector<float> random_values(std::size_t count, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

std::string shape_name(std::initializer_list<std::pair<const char*, int>> dims) {
  std::string name;
  for (const auto& [label, value] : dims) name += (name.empty() ? "" : " ") + std::string(label) + "=" + std::to_string(value);
  return name;
}

}  // namespace pipesim::cuda_test
