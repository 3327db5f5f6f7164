#include "daemon/server/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>

namespace stash::daemon {
namespace {

namespace r = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// `file` and every file it imports, each once, dependencies after their dependents.
void AddFile(const FileDescriptor* file, std::set<std::string>* sent,
             r::FileDescriptorResponse* out) {
  if (!sent->insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), sent, out);
}

void NotFound(const std::string& what, r::ServerReflectionResponse* out) {
  out->mutable_error_response()->set_error_code(static_cast<int>(grpc::StatusCode::NOT_FOUND));
  out->mutable_error_response()->set_error_message(what + " not found");
}

}  // namespace

r::ServerReflectionResponse ReflectionV1Service::Answer(
    const r::ServerReflectionRequest& request) const {
  r::ServerReflectionResponse out;
  out.set_valid_host(request.host());
  *out.mutable_original_request() = request;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<std::string> sent;
  switch (request.message_request_case()) {
    case r::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        out.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case r::ServerReflectionRequest::kFileByFilename:
      if (const FileDescriptor* file = pool->FindFileByName(request.file_by_filename())) {
        AddFile(file, &sent, out.mutable_file_descriptor_response());
      } else {
        NotFound("file " + request.file_by_filename(), &out);
      }
      break;
    case r::ServerReflectionRequest::kFileContainingSymbol:
      if (const FileDescriptor* file =
              pool->FindFileContainingSymbol(request.file_containing_symbol())) {
        AddFile(file, &sent, out.mutable_file_descriptor_response());
      } else {
        NotFound("symbol " + request.file_containing_symbol(), &out);
      }
      break;
    case r::ServerReflectionRequest::kFileContainingExtension: {
      const auto* type =
          pool->FindMessageTypeByName(request.file_containing_extension().containing_type());
      const auto* extension =
          type == nullptr ? nullptr
                          : pool->FindExtensionByNumber(
                                type, request.file_containing_extension().extension_number());
      if (extension != nullptr) {
        AddFile(extension->file(), &sent, out.mutable_file_descriptor_response());
      } else {
        NotFound("extension", &out);
      }
      break;
    }
    case r::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        NotFound("type " + request.all_extension_numbers_of_type(), &out);
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = out.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* e : extensions) numbers->add_extension_number(e->number());
      break;
    }
    case r::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      out.mutable_error_response()->set_error_code(
          static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      out.mutable_error_response()->set_error_message("the request names no question");
      break;
  }
  return out;
}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* /*context*/,
    grpc::ServerReaderWriter<r::ServerReflectionResponse, r::ServerReflectionRequest>* stream) {
  r::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace stash::daemon
