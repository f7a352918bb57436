#pragma once
/// Error values for library code: nothing below tools/ prints or exits; it returns an Error that
/// names the spot and the fix, and the CLI decides how to report it.
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace pipesim {

struct Error {
  std::string message;
};

/// Either a value or an Error. Kept tiny on purpose: `ok()`, `value()`, `error()`.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}
  Result(Error error) : data_(std::move(error)) {}

  bool ok() const { return std::holds_alternative<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T& value() & { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const Error& error() const { return std::get<Error>(data_); }

 private:
  std::variant<T, Error> data_;
};

/// Success or an Error, for operations without a value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}
  static Status Ok() { return {}; }

  bool ok() const { return !error_.has_value(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

}  // namespace pipesim
