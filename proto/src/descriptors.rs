//! The compiled-in descriptors ([`crate::FILE_DESCRIPTOR_SET`]), decoded
//! once and indexed: every message and enum by its full name, for the
//! checks that follow them (the JSON gateway's, and gogo's parse errors in
//! [`crate::gogo`]).

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

/// A message's descriptor and the Go type name gogo generates for it.
#[derive(Debug)]
pub struct MessageDescriptor {
    /// The descriptor.
    pub descriptor: DescriptorProto,
    /// `RangeRequest`; a nested message is `Outer_Inner`.
    pub go_name: String,
}

/// Every message and enum, by full name (`.pkg.Name`, nested
/// `.pkg.Outer.Inner`).
#[derive(Debug, Default)]
pub struct Descriptors {
    /// The messages.
    pub messages: HashMap<String, MessageDescriptor>,
    /// The enums (top-level and nested in messages).
    pub enums: HashMap<String, EnumDescriptorProto>,
}

/// The index of the compiled-in descriptors, built at first use.
pub fn descriptors() -> &'static Descriptors {
    static DESCRIPTORS: OnceLock<Descriptors> = OnceLock::new();
    DESCRIPTORS.get_or_init(|| {
        let set = FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).unwrap_or_default();
        let mut index = Descriptors::default();
        for file in &set.file {
            let prefix = format!(".{}", file.package());
            for m in &file.message_type {
                index.add_message(&prefix, "", m);
            }
            for e in &file.enum_type {
                index
                    .enums
                    .insert(format!("{prefix}.{}", e.name()), e.clone());
            }
        }
        index
    })
}

impl Descriptors {
    fn add_message(&mut self, prefix: &str, go_prefix: &str, m: &DescriptorProto) {
        let name = format!("{prefix}.{}", m.name());
        let go_name = format!("{go_prefix}{}", m.name());
        for nested in &m.nested_type {
            self.add_message(&name, &format!("{go_name}_"), nested);
        }
        for e in &m.enum_type {
            self.enums.insert(format!("{name}.{}", e.name()), e.clone());
        }
        let descriptor = m.clone();
        self.messages.insert(
            name,
            MessageDescriptor {
                descriptor,
                go_name,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_enums_by_full_name() {
        let d = descriptors();
        assert_eq!(
            d.messages[".etcdserverpb.RangeRequest"].go_name,
            "RangeRequest"
        );
        assert!(d.enums.contains_key(".etcdserverpb.RangeRequest.SortOrder"));
        assert!(d.enums.contains_key(".mvccpb.Event.EventType"));
    }
}
