//! The dynamic-linking facts of one ELF object, read with `goblin` (pure: bytes in, facts out).

use goblin::elf::Elf;

/// ELF magic: the first four bytes of every ELF object.
pub(crate) const MAGIC: &[u8; 4] = b"\x7fELF";

/// What the dynamic loader needs to know about one object to find its dependencies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElfInfo {
    /// 64-bit object (`ELFCLASS64`); the loader skips candidates of the other class.
    pub is_64: bool,
    /// `e_machine`; the loader skips candidates built for another machine.
    pub machine: u16,
    /// `DT_NEEDED` entries, in file order.
    pub needed: Vec<String>,
    /// `DT_RPATH` directories (colon lists split), searched before `LD_LIBRARY_PATH`.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` directories, searched after `LD_LIBRARY_PATH`; their presence disables
    /// `DT_RPATH`.
    pub runpath: Vec<String>,
    /// `DT_SONAME`.
    pub soname: Option<String>,
    /// `PT_INTERP`: the program interpreter of an executable (`/lib64/ld-linux-x86-64.so.2`).
    pub interpreter: Option<String>,
}

impl ElfInfo {
    /// True when `bytes` start with the ELF magic.
    pub(crate) fn is_elf(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    /// Parse the dynamic section of an ELF object. An error means the bytes start with the ELF
    /// magic but are not a valid object.
    pub fn parse(bytes: &[u8]) -> Result<ElfInfo, String> {
        let elf = Elf::parse(bytes).map_err(|e| e.to_string())?;
        let split = |entries: &[&str]| -> Vec<String> {
            entries
                .iter()
                .flat_map(|e| e.split(':'))
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect()
        };
        Ok(ElfInfo {
            is_64: elf.is_64,
            machine: elf.header.e_machine,
            needed: elf.libraries.iter().map(|s| s.to_string()).collect(),
            rpath: split(&elf.rpaths),
            runpath: split(&elf.runpaths),
            soname: elf.soname.map(str::to_string),
            interpreter: elf.interpreter.map(str::to_string),
        })
    }

    /// The loader's default library directories for this object's machine, after
    /// `ld.so.conf`: the Debian/Ubuntu multiarch directories, then the `lib64` directories of
    /// RPM distributions, then `/lib` and `/usr/lib`.
    pub(crate) fn default_dirs(&self) -> Vec<&'static str> {
        let multiarch: &[&str] = match (self.machine, self.is_64) {
            (goblin::elf::header::EM_X86_64, true) => {
                &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
            }
            (goblin::elf::header::EM_AARCH64, true) => {
                &["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
            }
            (goblin::elf::header::EM_PPC64, true) => &[
                "/lib/powerpc64le-linux-gnu",
                "/usr/lib/powerpc64le-linux-gnu",
            ],
            (goblin::elf::header::EM_386, false) => {
                &["/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu"]
            }
            _ => &[],
        };
        let mut dirs: Vec<&'static str> = multiarch.to_vec();
        if self.is_64 {
            dirs.extend(["/lib64", "/usr/lib64"]);
        }
        dirs.extend(["/lib", "/usr/lib"]);
        dirs
    }

    /// True when the loader would accept `other` as a dependency of `self` (same class and
    /// machine).
    pub fn compatible(&self, other: &ElfInfo) -> bool {
        self.is_64 == other.is_64 && self.machine == other.machine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_debian_library() {
        // libc.so.6 is on every machine this builds on; its facts are stable across versions.
        let Ok(bytes) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("skipping: no /lib/x86_64-linux-gnu/libc.so.6 on this machine");
            return;
        };
        let info = ElfInfo::parse(&bytes).unwrap();
        assert!(info.is_64);
        assert_eq!(info.soname.as_deref(), Some("libc.so.6"));
        assert_eq!(info.needed, vec!["ld-linux-x86-64.so.2".to_string()]);
        assert!(info.default_dirs().contains(&"/usr/lib/x86_64-linux-gnu"));
    }

    #[test]
    fn garbage_after_the_magic_is_an_error_not_a_panic() {
        assert!(ElfInfo::is_elf(b"\x7fELF\x02\x01"));
        assert!(ElfInfo::parse(b"\x7fELF\x02\x01\x01garbage").is_err());
        assert!(!ElfInfo::is_elf(b"#!/bin/sh"));
    }
}
